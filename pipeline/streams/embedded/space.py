"""Running out of disk space: which OS errors mean it, and the typed error they become.

A full disk (ENOSPC), a full quota (EDQUOT) and a file size limit (EFBIG, RLIMIT_FSIZE) all
raise `StoreFull`. The caller undoes what it half-wrote first, so nothing of the failed write
becomes visible and the next write, once space is freed, starts from a clean end.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pipeline.streams.errors import StoreFull

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@contextmanager
def out_of_space(path: Path, undo: Callable[[], object] | None = None) -> Iterator[None]:
    """Turn a full disk inside the block into `StoreFull`, after calling `undo` (best effort).

    Any other OSError is re-raised unchanged, also after `undo`.
    """
    try:
        yield
    except OSError as exc:
        if undo is not None:
            with suppress(OSError):
                undo()
        if exc.errno in FULL_ERRNOS:
            raise StoreFull(str(path), exc.strerror or str(exc)) from None
        raise
