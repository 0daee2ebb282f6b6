"""Edges of the flatten and of users' schemas: what an odd event or schema gets, on every path."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.schemas import Events, UnsupportedSchema, flatten, flatten_plan, parse_schema_text
from pipeline.schemas.plan import FlattenPlan


def events_of(payloads: list[bytes]) -> Events:
    count = len(payloads)
    return Events(
        stream="edge/odd",
        payloads=payloads,
        segments=[0] * count,
        offsets=[100 * i for i in range(count)],
        routing_keys=["k"] * count,
        ingest_ns=[1_700_000_000_000_000_000] * count,
    )


def plan_of(*fields: dict) -> FlattenPlan:
    return FlattenPlan(parse_schema_text(json.dumps(record("T", *fields)), "odd.avsc"))


def record(name: str, *fields: dict) -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


def nic(**extra: object) -> dict:
    event = {"RemoteAddr": "h", "Interface": "e", "TimestampNanos": [1, 2]}
    return event | {"RxBytes": [3, 4], "TxBytes": [5, 6]} | extra


def nested(depth: int) -> bytes:
    """A NIC event with an unknown field nested `depth` objects deep."""
    deep = b'{"a":' * depth + b"1" + b"}" * depth
    return json.dumps(nic()).encode()[:-1] + b', "deep": ' + deep + b"}"


def alone_and_among_bad(plan: FlattenPlan, payload: bytes) -> tuple[list, list]:
    """The event's rows and reasons flattened alone (all at once) and beside a bad event
    (one event at a time); both must be the same."""
    alone = flatten(plan, events_of([payload]))
    among = flatten(plan, events_of([payload, b"not json"]))
    rows = [alone.rows.to_pylist(), among.rows.to_pylist()]
    reasons = [alone.quarantine.column("reason").to_pylist()]
    reasons.append(among.quarantine.column("reason").to_pylist()[:-1])
    assert rows[0] == rows[1] and reasons[0] == reasons[1]
    return rows[0], reasons[0]


def test_an_event_nested_too_deeply_is_quarantined_not_a_crash():
    plan = flatten_plan("NetworkSamples")
    for deep in (
        nested(5000),
        json.dumps(nic()).encode()[:-1] + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ):
        rows, reasons = alone_and_among_bad(plan, deep)
        assert rows == []
        assert reasons == [reasons[0]] and reasons[0].startswith("nested too deeply")


@pytest.mark.parametrize("depth", [990, 1000, 1020])
def test_an_event_about_a_thousand_levels_deep_gets_one_answer_whatever_its_batch(depth):
    rows, reasons = alone_and_among_bad(flatten_plan("NetworkSamples"), nested(depth))
    assert (len(rows), reasons) == (2, [])


@pytest.mark.parametrize(
    ("field", "text"),
    [("f", "1e300"), ("f", "-3.5e38"), ("fs", "[1.0, 1e39]"), ("fs", "[-1e300]")],
)
def test_an_avro_float_beyond_32_bits_is_quarantined_never_infinity(field, text):
    plan = plan_of(
        {"name": "f", "type": "float"},
        {"name": "fs", "type": {"type": "array", "items": "float"}},
    )
    event = {"f": 1.5, "fs": [2.5]}
    payload = json.dumps(event).replace(
        f'"{field}": {json.dumps(event[field])}', f'"{field}": {text}'
    )
    rows, reasons = alone_and_among_bad(plan, payload.encode())
    assert rows == []
    assert len(reasons) == 1 and "3.4028234663852886e+38" in reasons[0]


def test_the_largest_32_bit_float_is_kept():
    plan = plan_of(
        {"name": "f", "type": "float"},
        {"name": "fs", "type": {"type": "array", "items": "float"}},
    )
    payload = json.dumps({"f": 3.4028234663852886e38, "fs": [-3.4028234663852886e38]}).encode()
    rows, reasons = alone_and_among_bad(plan, payload)
    assert reasons == []
    assert (rows[0]["f"], rows[0]["fs"]) == (3.4028234663852886e38, -3.4028234663852886e38)


@pytest.mark.parametrize("items", ["long", "int", "double", "float"])
def test_an_array_of_optional_numbers_keeps_its_nulls(items):
    plan = plan_of(
        {"name": "t", "type": {"type": "array", "items": ["null", items]}},
        {"name": "s", "type": {"type": "array", "items": "long"}},
    )
    rows, reasons = alone_and_among_bad(plan, b'{"t": [1, null, 3], "s": [1, 2, 3]}')
    assert reasons == []
    assert [r["t"] for r in rows] == [1, None, 3]


def test_an_empty_event_says_so():
    rows, reasons = alone_and_among_bad(flatten_plan("NetworkSamples"), b"")
    assert (rows, reasons) == ([], ["invalid JSON: the event is empty"])


def unsupported(*fields: dict, field: str, reason: str) -> None:
    message = f"schema odd.avsc: field {field!r} cannot be flattened: {reason}"
    with pytest.raises(UnsupportedSchema, match=re.escape(message)):
        plan_of(*fields)


def test_a_recursive_record_is_refused():
    unsupported(
        {"name": "value", "type": "int"},
        {"name": "next", "type": ["null", "T"]},
        field="T",
        reason="the record holds itself (a recursive type has no flat form)",
    )


def test_a_record_used_twice_is_not_recursive():
    inner = record("Point", {"name": "x", "type": "int"})
    plan = plan_of({"name": "a", "type": inner}, {"name": "b", "type": "Point"})
    assert [c.name for c in plan.columns] == ["a_x", "b_x"]


def test_a_field_of_type_null_is_refused():
    unsupported(
        {"name": "nothing", "type": "null"},
        field="nothing",
        reason="a field of type null holds no value",
    )


@pytest.mark.parametrize("name", ["a b", "a-b", "1a", "é", ""])
def test_a_field_name_that_is_not_an_avro_name_is_refused_by_its_name(name):
    reason = "not an Avro name: a letter or _, then letters, digits and _ only"
    unsupported(
        {"name": "ok", "type": "int"}, {"name": name, "type": "int"}, field=name, reason=reason
    )


@pytest.mark.parametrize("name", ["date", "hour", "Date", "HOUR"])
def test_a_column_named_as_a_partition_is_refused(name):
    reason = "the name is a partition column of the export (date=…/hour=…); rename it"
    unsupported({"name": name, "type": "string"}, field=name, reason=reason)


def test_columns_that_differ_only_in_case_are_refused():
    reason = "two fields flatten to this column name (case aside); rename one"
    inner = record("B", {"name": "C", "type": "int"})
    unsupported(
        {"name": "a_b_c", "type": "int"},
        {"name": "A_B", "type": inner},
        field="A_B_C",
        reason=reason,
    )
    unsupported(
        {"name": "_Sample", "type": "int"}, field="_Sample", reason="the name is a lineage column"
    )
