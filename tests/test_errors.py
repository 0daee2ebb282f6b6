"""`sigterm_interrupts`: a SIGTERM in its block always ends the block as `Interrupted`."""

from __future__ import annotations

import gc
import signal
import sys
import weakref

import pytest

from pipeline.errors import Interrupted, sigterm_interrupts


class Thing:
    pass


def test_a_sigterm_whose_exception_python_could_only_print_still_interrupts(monkeypatch):
    """The signal's handler runs wherever Python is: in a weakref callback (an import lock's,
    as Spark started) its exception is printed and dropped, and the run went on as if no
    SIGTERM had come (a mirror ran its batch and exited 0)."""
    dropped: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda found: dropped.append(found.exc_value))
    with pytest.raises(Interrupted) as raised, sigterm_interrupts():
        handler = signal.getsignal(signal.SIGTERM)
        thing = Thing()
        ref = weakref.ref(thing, lambda _: handler(signal.SIGTERM, None))
        del thing
        gc.collect()
        assert ref() is None
    assert raised.value.signum == signal.SIGTERM
    assert [type(e) for e in dropped] == [Interrupted]  # the handler's own was dropped
