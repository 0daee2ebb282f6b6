"""Stopping a job's streaming query between two batches: on SIGTERM or Ctrl-C, or after a time.

Spark's `query.stop()` interrupts whatever the query is doing, a batch's tasks or its sink's
commit included. The sinks make even that exactly-once (the next run finishes or skips the
batch through the ledger: `pipeline/spark/DESIGN.md`), but the batch is left in doubt and
its report is lost. A stop asked for on purpose lands between two batches instead:

1. the job asks with a file, `<checkpoint>/stop/requested` (`StopGate`); each `sluice`
   source of the query was given its path (option `stopRequest`) and a file of its own to
   create when it sees it (`stopSeen`);
2. Spark plans a batch by asking every source for its latest offset, at the start of a
   trigger, after the previous batch's sink commit and its commit log entry; a source that
   finds the request offers nothing new, so no batch is planned, and says it saw it;
3. from then on no batch is in flight, and none will be planned, once every source has
   seen the request (the trigger that saw it last planned nothing, and the earlier ones
   ended) or, sooner, once Spark's status says no trigger is active (read after the request
   was made, so any later trigger plans nothing), provided a first trigger has ended (the
   first one of a run may re-run a batch the previous run left planned, without asking the
   sources). Stopping the query then interrupts an idle trigger at most, and the checkpoint
   is settled. A run until caught up ends by itself at the gate (nothing more to read).

A job's sink may ask too, from inside a batch, by closing the gate with a reason (the
console job, when the reader of its output went away): the waiting loop then stops the query
as on a first signal, after that batch.

So the stop comes right after the batch in flight, or at once when none is. Signals
(`StopRequest.installed`, for the command line): the first SIGTERM or SIGINT asks for that
stop; a second stops the query at once, mid-batch if need be (exactly-once still: the next run
finishes that batch), and gives both signals back to their earlier handlers, so a third ends
the process as it would have before.
"""

from __future__ import annotations

import logging
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopGate:
    """The stop request of one query, as files under `root` (the module doc, steps 1 and 3)."""

    def __init__(self, root: Path, sources: int) -> None:
        self.root, self.sources = root, sources

    @property
    def request_file(self) -> Path:
        return self.root / "requested"

    def seen_file(self, source: int) -> Path:
        return self.root / f"seen-{source}"

    def source_options(self, source: int) -> dict[str, str]:
        """The options that connect the `sluice` source number `source` to this gate."""
        return {"stopRequest": str(self.request_file), "stopSeen": str(self.seen_file(source))}

    def clear(self) -> None:
        """Forget a request left by an earlier run (call it holding the checkpoint)."""
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir()

    def close(self, reason: str = "") -> None:
        """Ask the query's sources to plan no more batches; `reason` (from a sink asking for
        the stop) is for the loop that waits for the query (`StopRequest.act`)."""
        if reason:
            self.request_file.write_text(reason)
        else:
            self.request_file.touch()

    @property
    def asked(self) -> str | None:
        """The reason written with a request (a sink's), or None when there is none."""
        try:
            return self.request_file.read_text() or None
        except FileNotFoundError:
            return None

    @property
    def closed(self) -> bool:
        """True once every source saw the request: no batch is in flight or to come."""
        return all(self.seen_file(i).exists() for i in range(self.sources))


class StopRequest:
    """A query's stop, asked for by signals (`installed`) or by the job (`ask`), carried out
    by the loop that waits for the query (`act`): the first ask stops it between batches
    through `gate`, a second signal at once (the module doc). Without a gate every stop is
    at once."""

    def __init__(self, gate: StopGate | None = None) -> None:
        self.gate = gate
        self.stop = threading.Event()
        self.now = threading.Event()
        self.reason = ""
        self.by_signal = False
        self._gate_closed = False
        self._said: set[str] = set()
        self._earlier: dict[int, Any] = {}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler. It only sets flags: `act` does the rest from the waiting loop,
        so no call into py4j or gRPC is interrupted halfway (a traceback, not a stop)."""
        name = signal.Signals(signum).name
        self.by_signal = True
        if not self.stop.is_set():
            self.reason = f"{name} received"
            self.stop.set()
        else:
            self.reason = f"{name} again"
            self.now.set()
            self._restore()  # a third signal does what it did before this query ran

    def ask(self, reason: str) -> None:
        """Ask for a stop between batches, as a first signal does."""
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()

    @contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Handle SIGTERM and SIGINT in this block (from the main thread; elsewhere nothing is
        installed), then give them back to their earlier handlers (pyspark's for SIGINT)."""
        if threading.current_thread() is threading.main_thread():
            self._earlier = {s: signal.signal(s, self.handle) for s in STOP_SIGNALS}
        try:
            yield self
        finally:
            self._restore()

    def act(self, query: StreamingQuery) -> None:
        """Called by the waiting loop: stop `query` if a stop is asked for and due, by a
        signal, by the job, or by its sink through the gate."""
        if not self.stop.is_set() and self.gate is not None and (reason := self.gate.asked):
            self.ask(reason)
        if not self.stop.is_set():
            return
        if self.now.is_set() or self.gate is None:
            self._say(
                "now",
                "stopping the query now, mid-batch if one is in flight (the next "
                "run finishes that batch, exactly once)",
            )
            query.stop()
            return
        if not self._gate_closed:
            self.gate.close()
            self._gate_closed = True
            self._say(
                "gate",
                "stopping after the batch in flight (send the signal again to stop at once)",
            )
        if self.gate.closed or _between_triggers(query):
            query.stop()

    def _say(self, stage: str, text: str) -> None:
        """Say once how the query stops: a warning for a signal (the user waits for it)."""
        if stage not in self._said:
            self._said.add(stage)
            log.log(
                logging.WARNING if self.by_signal else logging.INFO, "%s: %s", self.reason, text
            )

    def _restore(self) -> None:
        earlier, self._earlier = self._earlier, {}
        for signum, handler in earlier.items():
            signal.signal(signum, handler)


def _between_triggers(query: StreamingQuery) -> bool:
    """Spark says no trigger is active, and a first one has ended (module doc, step 3)."""
    return query.lastProgress is not None and not query.status["isTriggerActive"]
