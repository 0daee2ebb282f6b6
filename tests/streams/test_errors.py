"""Every stream-store error survives pickling with its fields and message (Spark ships errors
between the driver and its executors)."""

from __future__ import annotations

import inspect
import pickle

import pytest

from pipeline.streams import errors

#: Every exception class that pipeline/streams/errors.py defines.
ERRORS = [
    cls
    for cls in vars(errors).values()
    if isinstance(cls, type)
    and issubclass(cls, BaseException)
    and cls.__module__ == errors.__name__
]


def build(cls: type[errors.StreamStoreError]) -> errors.StreamStoreError:
    """An instance of `cls` with a distinct value for each constructor argument."""
    if cls is errors.StreamStoreError:
        return cls("something went wrong")
    params = inspect.signature(cls).parameters.values()
    return cls(
        **{
            p.name: 100 + i if p.annotation == "int" else f"{p.name}-value"
            for i, p in enumerate(params)
        }
    )


def test_the_list_holds_the_errors_that_pickle_their_own_way():
    assert errors.StreamStoreError in ERRORS
    assert errors.StoreUnavailable in ERRORS, "an OSError: its __new__ leaves args to __init__"
    assert errors.CutStreamMismatch in ERRORS, "a subclass with other fields than its parent"


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_error_round_trips_through_pickle(cls):
    error = build(cls)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error), "every field comes back"


def test_a_truncation_is_found_in_the_text_of_a_failed_query():
    """Spark reports a Python worker's error as text: the last `Truncated` in it is found."""
    first = errors.Truncated("a/s", 1, 0, 10)
    last = errors.Truncated("sensors/nic-0.eu", 12, 345, 6789)
    report = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        f"pipeline.streams.errors.Truncated: {first}\n  at ...\n"
        f"pipeline.streams.errors.Truncated: {last}\n  at org.apache.spark..."
    )
    found = errors.Truncated.last_in(report)
    assert found is not None
    assert (found.stream, found.segment, found.offset, found.truncated_at) == (
        "sensors/nic-0.eu",
        12,
        345,
        6789,
    )
    assert str(found) == str(last)
    assert errors.Truncated.last_in(f"ValueError: {last}") is None, "another error's text"
