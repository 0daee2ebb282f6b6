"""Sampling on a schedule: absolute deadlines on the monotonic clock, and a bounded handoff.

`Pacer` wakes at `start + k * period` for k = 1, 2, ...: sleeping to an absolute deadline
means an oversleep on one tick is not carried into the next, so intervals do not drift (the
reference uses a token bucket with spin-waiting; this sleeps, which costs far less CPU, and
Linux's high-resolution timers keep a wake-up within tens of microseconds). If the sampler
falls more than `max_lag` behind (the machine stalled), the missed ticks are counted and
the schedule restarts from now instead of firing a burst of back-to-back samples.

`Handoff` moves finished batches from a timing-critical sampler to a thread that serializes
them and appends them to the buffer, so an fsync never delays a sample. Its queue holds at
most `depth` batches; when it is full the sampler waits (the buffer's `when_full` policy
decides what happens further down).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_SPIN_FREE = 0.05  # sleeps longer than this wait on the stop event instead


class Pacer:
    """Deadlines `start + k * period` on the monotonic clock."""

    def __init__(self, period: float, max_lag: float = 1.0) -> None:
        self.period = period
        self.max_lag = max(max_lag, 2 * period)
        self.start = time.monotonic()
        self.ticks = 0
        self.missed = 0

    def wait(self, stop: threading.Event) -> bool:
        """Sleep until the next deadline; False once `stop` is set."""
        self.ticks += 1
        due = self.start + self.ticks * self.period
        while True:
            if stop.is_set():
                return False
            left = due - time.monotonic()
            if left <= 0:
                break
            if left > _SPIN_FREE:
                stop.wait(left - _SPIN_FREE / 2)
            else:
                time.sleep(left)
        late = -left
        if late > self.max_lag:
            self.missed += int(late / self.period)
            self.start, self.ticks = time.monotonic(), 0
        return True


class Handoff(Generic[T]):
    """A bounded queue of batches and the thread that consumes them, in order."""

    _DONE = object()

    def __init__(self, consume: Callable[[T], None], name: str, depth: int = 4) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._consume = consume
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: T) -> None:
        """Queue `item` (waiting while the queue is full); re-raise a consumer failure."""
        if self._error is not None:
            raise self._error
        self._queue.put(item)

    def close(self) -> None:
        """Consume everything queued, stop the thread, re-raise a consumer failure."""
        self._queue.put(self._DONE)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._DONE:
                return
            if self._error is None:
                try:
                    self._consume(item)
                except BaseException as exc:  # handed to the sampler thread by put/close
                    self._error = exc
