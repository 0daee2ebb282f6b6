"""Sampling on a schedule: absolute deadlines on the monotonic clock.

`Pacer` wakes at `start + k * period` for k = 1, 2, ...: sleeping to an absolute deadline
means an oversleep on one tick is not carried into the next, so intervals do not drift. (The
Pravega Sensor Collector's `NetworkDriver` spins on a token bucket; this sleeps, which costs
far less CPU, and Linux's high-resolution timers keep a wake-up close to its deadline.)

A wake-up a whole period or more late (the machine was busy, or stalled) skips the deadlines
that have already passed: they are counted in `missed`, and the sample is taken for the
latest passed deadline, on the same grid. It never fires the missed ticks back to back: a
burst of samples microseconds apart would turn one packet into a spike of gigabits per second
in every rate computed from them. A period of any length works: it is waited for in steps of
at most a minute (a single timed wait longer than about 292 years overflows).
"""

from __future__ import annotations

import threading
import time

_SPIN_FREE = 0.05  # sleeps longer than this wait on the stop event instead
_LONGEST_WAIT = 60.0  # one wait at most (a period of days or more is waited for in steps)


class Pacer:
    """Deadlines `start + k * period` on the monotonic clock."""

    def __init__(self, period: float) -> None:
        self.period = period
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
                stop.wait(min(left - _SPIN_FREE / 2, _LONGEST_WAIT))
            else:
                time.sleep(left)
        passed = int(-left / self.period)  # later deadlines that have passed too
        self.missed += passed
        self.ticks += passed
        return True
