"""Event times as sensors really send them, through the flatten: the epoch, before 1970, the
limits of 64-bit nanoseconds, and a `timestamp-millis`/`-micros` value beyond them."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pipeline.schemas import flatten, flatten_plan, parse_schema_text
from pipeline.schemas.plan import FlattenPlan
from tests.schemas.test_edge_events import events_of

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def plan_of(logical: str, *, array: bool = True, nullable: bool = False) -> FlattenPlan:
    """`t` (a long of the logical type) and `v`, both arrays (parallel) or both scalars."""
    time: object = {"type": "long", "logicalType": logical}
    if nullable:
        time = ["null", time]
    fields = [{"name": "t", "type": time}, {"name": "v", "type": "double"}]
    if array:
        fields = [
            {"name": f["name"], "type": {"type": "array", "items": f["type"]}} for f in fields
        ]
    schema = {"type": "record", "name": "T", "fields": fields}
    return FlattenPlan(parse_schema_text(json.dumps(schema), "times.avsc"))


def event(t: object, v: object = 1.0) -> bytes:
    return json.dumps({"t": t, "v": v}).encode()


def reasons(result) -> list[str]:
    return result.quarantine.column("reason").to_pylist()


@pytest.mark.parametrize("t", [0, -1, -3_600_000_000_001, I64_MIN, I64_MAX, 10**18])
def test_a_nanosecond_time_anywhere_in_64_bits_is_its_own_event_time(t):
    result = flatten(flatten_plan("NetworkSamples"), events_of([nic_event([t, t])]))
    assert reasons(result) == []
    assert result.time_ns.tolist() == [t, t]


def nic_event(times: list[int]) -> bytes:
    n = len(times)
    return json.dumps(
        {"RemoteAddr": "h", "Interface": "e", "TimestampNanos": times}
        | {"RxBytes": list(range(n)), "TxBytes": list(range(n)), "LastTimestampFormatted": "x"}
    ).encode()


@pytest.mark.parametrize(
    ("logical", "unit", "last"),
    [("timestamp-millis", 10**6, "milliseconds"), ("timestamp-micros", 10**3, "microseconds")],
)
def test_a_millis_or_micros_time_beyond_64_bit_nanoseconds_is_quarantined(logical, unit, last):
    """Times the unit would wrap around (year 50,000 in microseconds came out as 1702,
    `I64_MAX` milliseconds as 1969-12-31T23:59:59.999): refused with the value and why."""
    plan = plan_of(logical)
    high, low = I64_MAX // unit, -(2**63 // unit)
    good = [event([high, low, 0], [1.0] * 3), event([-1, 1_700_000_000_000, 2], [1.0, 2.0, 3.0])]
    over = event([1, high + 1, I64_MAX], [4.0, 5.0, 6.0])
    under = event([low - 1], [7.0])
    payloads = [good[0], over, good[1], under]
    for together in (payloads, [*payloads, b"not json"]):  # all at once; one at a time
        result = flatten(plan, events_of(together), dictionary=len(together) > 4)
        times = [high * unit, low * unit, 0, -unit, 1_700_000_000_000 * unit, 2 * unit]
        assert result.time_ns.tolist() == times
        assert result.rows.column("v").to_pylist() == [1.0, 1.0, 1.0, 1.0, 2.0, 3.0]
        assert result.rows.column("_offset").to_pylist() == [0] * 3 + [200] * 3
        assert result.quarantine.column("_offset").to_pylist()[:2] == [100, 300]
        found = reasons(result)[:2]
        assert found[0] == (
            f"event time out of range: t = {high + 1} {last} since 1970 is after 2262-04-11, "
            "beyond 64-bit nanoseconds: no hour to put it in (schema T)"
        )
        assert found[1].startswith(f"event time out of range: t = {low - 1} {last} since 1970 ")
        assert "is before 1677-09-21" in found[1]


def test_a_scalar_or_optional_time_beyond_nanoseconds_is_quarantined_and_null_takes_ingest():
    plan = plan_of("timestamp-millis", array=False, nullable=True)
    payloads = [event(5, 1.0), event(10**17, 2.0), event(None, 3.0), event(-(10**17), 4.0)]
    result = flatten(plan, events_of(payloads), dictionary=True)
    assert result.time_ns.tolist() == [5 * 10**6, 1_700_000_000_000_000_000]
    assert result.rows.column("v").to_pylist() == [1.0, 3.0]
    assert result.quarantine.column("_offset").to_pylist() == [100, 300]
    pattern = re.escape("event time out of range: t = 100000000000000000 milliseconds since ")
    assert re.match(pattern, reasons(result)[0])


def test_an_int_millis_time_always_fits_and_costs_no_check():
    schema = {
        "type": "record",
        "name": "T",
        "fields": [{"name": "t", "type": {"type": "int", "logicalType": "timestamp-millis"}}],
    }
    plan = FlattenPlan(parse_schema_text(json.dumps(schema), "int.avsc"))
    result = flatten(plan, events_of([b'{"t": 2147483647}', b'{"t": -2147483648}']))
    assert result.time_ns.tolist() == [2147483647 * 10**6, -2147483648 * 10**6]
    assert result.time_ns.dtype == np.int64 and reasons(result) == []


@pytest.mark.parametrize(
    "times",
    [
        b"[1e18, 2]",
        b"[NaN, 1]",
        b"[1.5, 2]",
        b"[null, 1]",
        b'["1", 2]',
        b"[9223372036854775808, 1]",
    ],
)
def test_a_time_that_is_no_whole_number_of_64_bits_is_quarantined(times):
    payload = nic_event([1, 2]).replace(b"[1, 2]", times, 1)
    result = flatten(flatten_plan("NetworkSamples"), events_of([payload]))
    assert result.rows.num_rows == 0 and len(reasons(result)) == 1
