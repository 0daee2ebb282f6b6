"""Retention limits too large for the store to hold or compute with are refused, when a stream
is created and when a recorded policy is applied: never an overflow, never a stopped timer."""

from __future__ import annotations

import re

import pytest

from pipeline import cli
from pipeline.streams import InvalidArgument, Retention

#: The largest limits: bytes, and an age whose nanoseconds are a signed 64-bit integer.
MAX_BYTES, MAX_SECONDS = 2**63 - 1, (2**63 - 1) // 10**9
AGE_RULE = "keep events for at most 9,223,372,036 seconds (292 years), or set no age limit"


@pytest.mark.parametrize(
    ("retention", "message"),
    [
        (
            Retention(max_bytes=2**70),
            f"invalid retention max_bytes {2**70}: keep at most 9,223,372,036,854,775,807 bytes",
        ),
        (Retention(max_age_seconds=1e300), f"invalid retention max_age_seconds 1e+300: {AGE_RULE}"),
        (Retention(max_age_seconds=1e10), f"max_age_seconds 10000000000.0: {AGE_RULE}"),
    ],
)
def test_a_retention_too_large_to_hold_is_refused_and_nothing_is_created(store, retention, message):
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        store.create_stream("ret/huge", retention=retention)
    assert store.list_streams() == []


def test_the_largest_limits_are_kept_and_applied(store):
    limits = Retention(MAX_BYTES, float(MAX_SECONDS))
    store.create_stream("ret/max", retention=limits)
    with store.writer("ret/max") as w:
        w.write(b"e0")
    assert store.apply_retention("ret/max") is None
    assert [e.payload for e in store.read("ret/max")] == [b"e0"]


def test_retain_refuses_a_recorded_age_too_large_and_retains_the_other_streams(
    store, store_dir, capsys
):
    store.create_stream("ret/old", retention=Retention(max_age_seconds=60))
    store.create_stream("ret/young", retention=Retention(max_bytes=1))
    for stream in ("ret/old", "ret/young"):
        for i in range(2):
            with store.writer(stream) as w:
                w.write(f"e{i}".encode())
    with store._engine.catalog.write() as db:  # as an earlier Sluice recorded it
        db.execute("UPDATE streams SET retention_seconds=1e300 WHERE name='old'")
    store.close()
    assert cli.main(["--store", f"embedded:{store_dir}", "store", "retain"]) == 1
    out, err = capsys.readouterr()
    assert err == f"sluice: error: ret/old: invalid retention max_age_seconds 1e+300: {AGE_RULE}\n"
    assert out.startswith("ret/young: dropped ")
