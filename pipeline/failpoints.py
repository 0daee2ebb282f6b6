"""Named crash points, so tests can SIGKILL a process between any two steps.

A spec such as `sender.in_ready_txn:3,files.after_chunk` makes the process kill itself with
SIGKILL the 3rd time it reaches `sender.in_ready_txn` (and the 1st time it reaches
`files.after_chunk`). A process reads its spec once, when it starts, from its own variable
(the collector's `$SLUICE_COLLECTOR_FAILPOINTS`, the streaming join's
`$SLUICE_TEST_JOIN_FAILPOINTS`), and passes the `Failpoints` down explicitly; with no spec,
`hit` is a dictionary lookup that finds nothing.

A real SIGKILL (not an exception) is the point: nothing in the process gets to clean up,
which is exactly what a power cut or the OOM killer does in the field.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Collection

from pipeline.errors import SluiceError


class BadFailpoints(SluiceError, ValueError):
    """A failpoint spec that names no known point, or a hit count that is not 1 or more."""

    def __init__(self, variable: str, item: str, reason: str) -> None:
        self.variable, self.item, self.reason = variable, item, reason
        msg = f"{variable}: failpoint {item!r} {reason}; use NAME or NAME:HIT, separated by commas"
        super().__init__(msg)


class Failpoints:
    """Counts hits of named points and SIGKILLs the process at the configured hit.

    `known`: the points the process has (a spec naming another is refused); `group`: kill
    the whole process group when this process leads one (a job's driver started as a group
    leader takes its JVM and Python workers with it, as in a real crash of the machine)."""

    def __init__(
        self,
        spec: str | None = None,
        *,
        variable: str = "failpoints",
        known: Collection[str] | None = None,
        group: bool = False,
    ) -> None:
        self._remaining: dict[str, int] = {}
        self._lock = threading.Lock()
        self._group = group
        for item in filter(None, (part.strip() for part in (spec or "").split(","))):
            name, _, count = item.partition(":")
            if known is not None and name not in known:
                raise BadFailpoints(variable, item, f"names no point of {', '.join(known)}")
            if count and (not (count.isascii() and count.isdigit()) or int(count) < 1):
                raise BadFailpoints(variable, item, "needs a hit count of 1 or more")
            self._remaining[name] = int(count or 1)

    @classmethod
    def from_environment(
        cls, variable: str, *, known: Collection[str] | None = None, group: bool = False
    ) -> Failpoints:
        """The failpoints `$variable` names (none when it is not set)."""
        return cls(os.environ.get(variable), variable=variable, known=known, group=group)

    def __getstate__(self) -> dict:  # a Spark Connect foreachBatch function is pickled
        return {"remaining": self._remaining, "group": self._group}

    def __setstate__(self, state: dict) -> None:
        self._remaining, self._group = dict(state["remaining"]), state["group"]
        self._lock = threading.Lock()

    @property
    def armed(self) -> bool:
        return bool(self._remaining)

    @property
    def remaining(self) -> dict[str, int]:
        """Each armed point and the hits left until it kills."""
        return dict(self._remaining)

    def hit(self, name: str) -> None:
        """Count one pass through `name`; SIGKILL this process if it is the configured one."""
        if name not in self._remaining:
            return
        with self._lock:
            self._remaining[name] -= 1
            if self._remaining[name] > 0:
                return
        sys.stderr.write(f"failpoint {name}: SIGKILL\n")
        sys.stderr.flush()
        if self._group and os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
