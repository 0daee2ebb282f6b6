"""Named crash points, so tests can SIGKILL the collector between any two steps.

A spec such as `sender.in_ready_txn:3,files.after_chunk:1` makes the process kill itself with
SIGKILL the 3rd time it reaches `sender.in_ready_txn` (or the 1st time `files.after_chunk`).
The service reads the spec once at start-up from `$SLUICE_COLLECTOR_FAILPOINTS` and passes
it down explicitly; with no spec, `hit` is a dictionary lookup that finds nothing.

A real SIGKILL (not an exception) is the point: nothing in the process gets to clean up, which
is exactly what a power cut or the OOM killer does to a collector in the field.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from collectors.errors import ConfigError

ENV_VAR = "SLUICE_COLLECTOR_FAILPOINTS"


class Failpoints:
    """Counts hits of named points and SIGKILLs the process at the configured hit."""

    def __init__(self, spec: str | None = None) -> None:
        self._remaining: dict[str, int] = {}
        self._lock = threading.Lock()
        for item in (spec or "").split(","):
            if item.strip():
                name, count = _parse_item(item.strip())
                self._remaining[name] = count

    @property
    def armed(self) -> bool:
        return bool(self._remaining)

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
        os.kill(os.getpid(), signal.SIGKILL)


def _parse_item(item: str) -> tuple[str, int]:
    name, _, count = item.partition(":")
    if not count:
        return name, 1
    if not count.isdigit() or int(count) < 1:
        msg = f"failpoint {item!r} needs a positive hit count"
        raise ConfigError(ENV_VAR, msg, "use NAME or NAME:COUNT, separated by commas")
    return name, int(count)
