"""`sluice collect`: run every configured instance until SIGTERM/SIGINT, then drain and exit.

Start-up checks the settings and each driver's outside world (interface, device, directories,
broker) before anything starts: a problem is one `SluiceError` line, and nothing is sampled.
Shutdown: drivers stop and hand their partial batches to the buffer; senders send what is
buffered for up to `drain_timeout_seconds`; what is left stays in the buffer, safe, and is
sent at the next start. The service also ends, after draining, when every driver has finished
on its own (a generator with `max_samples`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from collectors.drivers.base import Driver
from collectors.drivers.registry import find_spec
from collectors.failpoints import Failpoints
from collectors.instance import Instance
from collectors.settings import CollectorSettings, InstanceSettings
from pipeline.streams import StreamStore, open_store

log = logging.getLogger(__name__)


def create_driver(settings: InstanceSettings) -> Driver:
    """Build the instance's driver, checking its device/interface/directories/broker."""
    found = find_spec(settings.driver)
    assert found is not None, settings.driver  # settings.py accepts known drivers only
    return found[0].load().create(settings)


def run_service(
    settings: CollectorSettings,
    failpoints: Failpoints,
    stop: threading.Event | None = None,
    store_opener: Callable[[str], StreamStore] = open_store,
    install_signals: bool = True,
) -> int:
    """Run until `stop` is set (SIGTERM/SIGINT with `install_signals`) or all drivers end."""
    for note in settings.notes:
        log.warning(note)
    drivers = [(inst, create_driver(inst)) for inst in settings.instances]
    stop = stop or threading.Event()
    if install_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    instances: list[Instance] = []
    try:
        for inst, driver in drivers:
            instance = Instance(inst, driver, failpoints, store_opener)
            instance.start()
            instances.append(instance)
        while not stop.is_set() and any(i.driver_running for i in instances):
            stop.wait(0.5)
        why = "stop requested" if stop.is_set() else "every driver has finished"
        log.info("%s: stopping drivers and draining buffers", why)
    finally:
        _shutdown(instances, settings.drain_timeout_seconds)
    return 0


def _shutdown(instances: list[Instance], drain_timeout: float) -> None:
    deadline = time.monotonic() + drain_timeout
    for instance in instances:
        instance.stop.set()
    for instance in instances:
        instance.join_driver(max(0.0, deadline - time.monotonic()))
        if instance.driver_running:
            log.error("%s: driver did not stop in time", instance.settings.name)
        instance.drain.set()
    for instance in instances:
        instance.join_sender(max(0.0, deadline - time.monotonic()))
        instance.halt.set()
    for instance in instances:
        instance.join_sender(10.0)
        if instance.sender_running or instance.driver_running:
            log.error(
                "%s: still busy after the drain timeout; exiting anyway (the buffer and the "
                "transaction records make this as safe as a crash)",
                instance.settings.name,
            )
            continue
        _report_left(instance)
        instance.close()


def _report_left(instance: Instance) -> None:
    left = instance.buffered()
    if left:
        log.warning(
            "%s: %d events stay in the buffer and will be sent at the next start",
            instance.settings.name,
            left,
        )
    else:
        log.info("%s: buffer drained", instance.settings.name)
