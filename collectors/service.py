"""`sluice collect`: run every configured instance until a stop signal, then drain and exit.

Start-up checks the settings, each driver's outside world (interface, device, directories,
broker), the metrics endpoint's port (`metrics_port`, if set: `metrics.py`) and each buffer
(its directory, that it is a collector buffer and this instance's) before anything starts: a
problem is one `SluiceError` line, and nothing is sampled. The endpoint serves until the
drain is over.

Shutdown, on SIGTERM, SIGINT or SIGHUP alike: drivers stop and hand their partial batches to
the buffer; senders send what is buffered; what is left stays in the buffer, safe, and is
sent at the next start (doubtful events, which are never sent by themselves, are counted
apart, with what to do: `sluice collect resolve`, in `resolve.py`). All of it ends within
`drain_timeout_seconds` whatever the drivers are doing (a driver that does not stop in time
is left behind: its buffer commits are atomic, so this is as safe as a crash). A second
signal ends the drain at once. SIGHUP does not reload the configuration: it stops like
SIGTERM, and the supervisor (systemd's `Restart=always`, Docker's restart policy) starts the
collector again, which reads its configuration anew. The service also ends, after draining,
when every driver has finished on its own (a generator with `max_samples`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from collectors.drivers.base import Driver
from collectors.drivers.registry import find_spec
from collectors.errors import CollectorError
from collectors.instance import Instance, prepare_directory
from collectors.metrics import serve_metrics
from collectors.settings import CollectorSettings, InstanceSettings
from pipeline.failpoints import Failpoints
from pipeline.streams import StreamStore, open_store
from pipeline.wording import agreeing, counted

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Part of the drain time kept for senders to finish the batch in flight once told to halt.
_HALT_GRACE_MAX = 5.0
_POLL = 0.05


def create_driver(settings: InstanceSettings) -> Driver:
    """Build the instance's driver, checking its device/interface/directories/broker."""
    found = find_spec(settings.driver)
    assert found is not None, settings.driver  # settings.py accepts known drivers only
    return found[0].load().create(settings)


class StopRequest:
    """What the stop signals asked for: the first one stops (`stop`), a second one ends the
    drain at once (`hurry`)."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.stop = stop or threading.Event()
        self.hurry = threading.Event()
        self.reason = "stop requested"

    def signal(self, signum: int, *_: object) -> None:
        name = signal.Signals(signum).name
        if not self.stop.is_set():
            self.reason = f"{name} received"
            self.stop.set()  # (the service logs it, with what the stop does)
        elif not self.hurry.is_set():
            self.hurry.set()
            log.warning("%s again: ending the drain now; what is buffered stays", name)

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.signal)


def run_service(
    settings: CollectorSettings,
    failpoints: Failpoints,
    stop: threading.Event | StopRequest | None = None,
    store_opener: Callable[[str], StreamStore] = open_store,
    install_signals: bool = True,
) -> int:
    """Run until a stop is requested (SIGTERM/SIGINT/SIGHUP with `install_signals`, or
    `stop` set) or all drivers end."""
    request = stop if isinstance(stop, StopRequest) else StopRequest(stop)
    for note in settings.notes:
        log.warning(note)
    for inst in settings.instances:
        prepare_directory(inst, settings.state_dir, settings.file_modes)
    drivers = [(inst, create_driver(inst)) for inst in settings.instances]
    metrics = serve_metrics(settings)  # a port it cannot listen on stops us here
    if install_signals:
        request.install()
    instances: list[Instance] = []
    try:
        for inst, driver in drivers:
            instance = Instance(inst, driver, failpoints, store_opener, settings.file_modes)
            instance.start()
            instances.append(instance)
        while not request.stop.is_set() and any(i.driver_running for i in instances):
            request.stop.wait(0.5)
        if not request.stop.is_set():
            request.reason = "every driver has finished"
        log.info(
            "%s: stopping drivers and draining buffers (at most %.0fs; a second signal ends"
            " the drain at once)",
            request.reason,
            settings.drain_timeout_seconds,
        )
    finally:
        try:
            _shutdown(instances, settings.drain_timeout_seconds, request)
        finally:
            if metrics is not None:
                metrics.close()
    return 0


def _shutdown(instances: list[Instance], drain_timeout: float, request: StopRequest) -> None:
    """Stop drivers, drain senders, halt them: all within `drain_timeout` (at once after a
    second signal)."""
    deadline = time.monotonic() + drain_timeout
    halt_at = deadline - min(_HALT_GRACE_MAX, drain_timeout / 4)
    for instance in instances:
        instance.stop.set()
    _wait(lambda: not any(i.driver_running for i in instances), halt_at, request.hurry)
    for instance in instances:
        if instance.driver_running:
            log.error(
                "%s: driver did not stop in time: left behind (its buffer commits are "
                "atomic, so this is as safe as a crash)",
                instance.settings.name,
            )
        instance.drain.set()
    _wait(lambda: not any(i.sender_running for i in instances), halt_at, request.hurry)
    for instance in instances:
        instance.halt.set()
    _wait_halted(instances, deadline, request.hurry)
    for instance in instances:
        if instance.sender_running or instance.driver_running:
            log.error(
                "%s: still busy after the drain timeout; exiting anyway (the buffer and the "
                "transaction records make this as safe as a crash)",
                instance.settings.name,
            )
            _close_once_idle(instance)
            continue
        _report_left(instance, request.reason)
        instance.close()


def _close_once_idle(instance: Instance) -> None:
    """Close an instance left busy once its threads end, in a daemon thread: a process that
    exits releases its buffers and lock itself, but one that goes on (a service run in
    another program's process) held the lock, and a next run was refused the buffer."""

    def close() -> None:
        while instance.sender_running or instance.driver_running:
            time.sleep(_POLL)
        instance.close()

    name = f"{instance.settings.name}-closer"
    threading.Thread(target=close, name=name, daemon=True).start()


def _wait(done: Callable[[], bool], until: float, hurry: threading.Event) -> None:
    while not done() and not hurry.is_set() and time.monotonic() < until:
        time.sleep(_POLL)


def _wait_halted(instances: list[Instance], deadline: float, hurry: threading.Event) -> None:
    """Wait for halted senders to finish their step: until the deadline, or for a moment
    more after a second signal."""
    hurried_at: float | None = None
    while any(i.sender_running for i in instances) and time.monotonic() < deadline:
        if hurry.is_set():
            hurried_at = hurried_at or time.monotonic()
            if time.monotonic() - hurried_at > _HALT_GRACE_MAX / 2:
                return
        time.sleep(_POLL)


def _report_left(instance: Instance, reason: str) -> None:
    """Log and record what stays in the buffer: pending events go at the next start, doubtful
    ones only when the operator says so (`sluice collect resolve`)."""
    name = instance.settings.name
    left = instance.buffered()
    note = f"{reason}; {counted(left.pending, 'event')} left in the buffer"
    if left.doubtful:
        note += f", and {counted(left.doubtful, 'doubtful event')}"
    try:
        instance.record_stop(note)
    except CollectorError as exc:  # a full disk: `collect status` tells an unclean stop
        log.error("%s: cannot record the stop: %s", name, exc)
    if left.pending:
        log.warning(
            "%s: %s %s in the buffer and will be sent at the next start",
            name,
            counted(left.pending, "event"),
            agreeing(left.pending, "stays", "stay"),
        )
    if left.doubtful:
        log.warning(
            "%s: %s %s in the buffer and will NOT be sent until you say so: the store no "
            "longer knows their transaction, so whether the stream holds them cannot be "
            "told; run `sluice collect resolve %s` to check the stream and resend or drop them",
            name,
            counted(left.doubtful, "doubtful event"),
            agreeing(left.doubtful, "stays", "stay"),
            name,
        )
    if not left.total:
        log.info("%s: buffer drained", name)
