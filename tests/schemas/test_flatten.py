"""The flatten: parallel arrays to rows, nested records, defaults, and every quarantine case."""

from __future__ import annotations

import importlib
import json
import math
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.schemas import Events, flatten, flatten_plan, parse_schema_text
from pipeline.schemas.plan import FlattenPlan

#: The module (the package exports a function of the same name).
flatten_module = importlib.import_module("pipeline.schemas.flatten")


def nic_event(i: int, n: int = 4, **extra) -> dict:
    t0 = 1_609_363_757_807_000_000 + i * n * 1_000_000
    event = {
        "TimestampNanos": [t0 + k * 1_000_000 for k in range(n)],
        "RxBytes": [719_763_680 + i * n + k for k in range(n)],
        "TxBytes": [4_594_274 + k for k in range(n)],
        "RemoteAddr": "ubuntu",
        "Interface": "ens33",
        "LastTimestampFormatted": "2020-12-30T21:29:17.809Z",
    }
    event.update(extra)
    return event


def events_of(payloads: list[bytes], segment: int = 0) -> Events:
    count = len(payloads)
    return Events(
        stream="examples/network",
        payloads=payloads,
        segments=[segment] * count,
        offsets=[100 * i for i in range(count)],
        routing_keys=[f"k{i}" for i in range(count)],
        ingest_ns=[1_700_000_000_000_000_000 + i for i in range(count)],
    )


def encode(*events: dict) -> list[bytes]:
    return [json.dumps(e).encode() for e in events]


@pytest.fixture
def nic() -> FlattenPlan:
    return flatten_plan("NetworkSamples")


def test_parallel_arrays_become_one_row_per_index_and_scalars_repeat(nic):
    result = flatten(nic, events_of(encode(nic_event(0), nic_event(1, n=3))))
    rows = result.rows.to_pylist()
    assert len(rows) == 7
    assert [r["_sample"] for r in rows] == [0, 1, 2, 3, 0, 1, 2]
    assert [r["_offset"] for r in rows] == [0] * 4 + [100] * 3
    assert {r["RemoteAddr"] for r in rows} == {"ubuntu"}
    first = nic_event(0)
    assert [r["RxBytes"] for r in rows[:4]] == first["RxBytes"]
    assert [r["TimestampNanos"] for r in rows[:4]] == first["TimestampNanos"]
    assert result.quarantine.num_rows == 0
    assert result.time_ns.tolist() == [r["TimestampNanos"] for r in rows]


def test_columns_and_lineage_of_the_network_schema(nic):
    names = nic.arrow_schema.names
    assert names == [
        "RemoteAddr",
        "Interface",
        "TimestampNanos",
        "RxBytes",
        "TxBytes",
        "_segment",
        "_offset",
        "_sample",
    ]
    assert nic.time is not None and nic.time.name == "TimestampNanos"


def test_unknown_fields_are_ignored(nic):
    result = flatten(nic, events_of(encode(nic_event(0, RxPackets=[1, 2, 3, 4], Extra={"a": 1}))))
    assert result.rows.num_rows == 4
    assert result.quarantine.num_rows == 0


def test_an_event_with_empty_arrays_has_no_rows_and_is_not_quarantined(nic):
    event = nic_event(0, TimestampNanos=[], RxBytes=[], TxBytes=[])
    result = flatten(nic, events_of(encode(event)))
    assert result.rows.num_rows == 0
    assert result.quarantine.num_rows == 0


# --- quarantine: one test per case ------------------------------------------------------------


def quarantined(plan: FlattenPlan, payloads: list[bytes]) -> list[dict]:
    result = flatten(plan, events_of(payloads))
    return result.quarantine.to_pylist()


def test_quarantine_invalid_json(nic):
    good = encode(nic_event(0))[0]
    [bad] = quarantined(nic, [good, b'{"RemoteAddr": "x", "TimestampNanos": [1,'])
    assert bad["reason"].startswith("invalid JSON")
    assert bad["_offset"] == 100 and bad["_segment"] == 0 and bad["_routing_key"] == "k1"
    assert bad["payload"] == b'{"RemoteAddr": "x", "TimestampNanos": [1,'
    assert bad["schema"] == "NetworkSamples"


def test_quarantine_wrong_types(nic):
    cases = [
        nic_event(0, RxBytes=[1, 2.5, 3, 4]),
        nic_event(0, RxBytes=[1, True, 3, 4]),
        nic_event(0, RemoteAddr=7),
        nic_event(0, TxBytes="1,2,3,4"),
        nic_event(0, RxBytes=[1, 2, 3, 2**63]),
        nic_event(0, RemoteAddr=None),
    ]
    reasons = [q["reason"] for q in quarantined(nic, encode(*cases))]
    assert len(reasons) == len(cases)
    assert all(r.startswith("wrong type") for r in reasons), reasons
    assert "$.RxBytes[1]" in reasons[0]


def test_quarantine_unequal_arrays(nic):
    event = nic_event(0, RxBytes=[1, 2, 3])
    [bad] = quarantined(nic, encode(event))
    assert bad["reason"].startswith("unequal arrays")
    assert "RxBytes has 3" in bad["reason"] and "TimestampNanos has 4" in bad["reason"]


def test_quarantine_not_utf8(nic):
    payload = encode(nic_event(0))[0].replace(b'"ens33"', b'"ens\xff33"')
    [bad] = quarantined(nic, [payload])
    assert bad["reason"].startswith("not UTF-8")
    assert bad["payload"] == payload


def test_quarantine_not_utf8_even_in_an_ignored_field(nic):
    payload = encode(nic_event(0, Note="x"))[0].replace(b'"x"', b'"\xc3\x28"')
    [bad] = quarantined(nic, [payload])
    assert bad["reason"].startswith("not UTF-8")


def test_quarantine_missing_required_field(nic):
    event = nic_event(0)
    del event["Interface"]
    [bad] = quarantined(nic, encode(event))
    assert bad["reason"] == "missing required field: `Interface` (schema NetworkSamples)"


def test_quarantine_keeps_good_events_around_bad_ones(nic):
    payloads = [*encode(nic_event(0)), b"[]", b"null", *encode(nic_event(1))]
    result = flatten(nic, events_of(payloads))
    assert result.rows.num_rows == 8
    assert sorted(set(result.rows.column("_offset").to_pylist())) == [0, 300]
    assert result.quarantine.column("_offset").to_pylist() == [100, 200]


# --- schema evolution, nested records, optional fields -----------------------------------------

V1 = {
    "type": "record",
    "name": "Vibration",
    "namespace": "test",
    "fields": [
        {"name": "Sensor", "type": "string"},
        {"name": "TimestampNanos", "type": {"type": "array", "items": "long"}},
        {"name": "Level", "type": {"type": "array", "items": "double"}},
    ],
}
V2 = {
    **V1,
    "fields": [
        *V1["fields"],
        {"name": "Gain", "type": "double", "default": 1.5},
        {"name": "Unit", "type": ["null", "string"], "default": None},
        {"name": "Site", "type": "string", "default": "unknown"},
    ],
}


def plan_of(schema: dict) -> FlattenPlan:
    return FlattenPlan(parse_schema_text(json.dumps(schema), "test"))


def test_schema_evolution_old_events_take_the_new_fields_defaults():
    old = {"Sensor": "s1", "TimestampNanos": [1, 2], "Level": [0.5, 0.25]}
    new = {**old, "Gain": 2.0, "Unit": "mm/s", "Site": "plant"}
    result = flatten(plan_of(V2), events_of(encode(old, new)))
    rows = result.rows.select(["Sensor", "Level", "Gain", "Unit", "Site"]).to_pylist()
    assert rows == [
        {"Sensor": "s1", "Level": 0.5, "Gain": 1.5, "Unit": None, "Site": "unknown"},
        {"Sensor": "s1", "Level": 0.25, "Gain": 1.5, "Unit": None, "Site": "unknown"},
        {"Sensor": "s1", "Level": 0.5, "Gain": 2.0, "Unit": "mm/s", "Site": "plant"},
        {"Sensor": "s1", "Level": 0.25, "Gain": 2.0, "Unit": "mm/s", "Site": "plant"},
    ]


def test_schema_evolution_new_events_read_with_the_old_schema_drop_new_fields():
    new = {"Sensor": "s1", "TimestampNanos": [1], "Level": [0.5], "Gain": 2.0, "Site": "x"}
    result = flatten(plan_of(V1), events_of(encode(new)))
    assert result.rows.column_names == ["Sensor", "TimestampNanos", "Level", *LINEAGE_NAMES]
    assert result.rows.num_rows == 1


LINEAGE_NAMES = ["_segment", "_offset", "_sample"]


NESTED = {
    "type": "record",
    "name": "Station",
    "fields": [
        {"name": "Id", "type": "string"},
        {
            "name": "Location",
            "type": {
                "type": "record",
                "name": "Location",
                "fields": [
                    {"name": "Lat", "type": "double"},
                    {"name": "Lon", "type": "double"},
                    {"name": "Alt", "type": ["null", "double"], "default": None},
                ],
            },
        },
        {"name": "Backup", "type": ["null", "Location"], "default": None},
        {
            "name": "Readings",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Reading",
                    "fields": [
                        {"name": "t", "type": "long"},
                        {"name": "v", "type": "float"},
                        {"name": "ok", "type": "boolean", "default": True},
                    ],
                },
            },
        },
        {"name": "Kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "Tags", "type": {"type": "map", "values": "string"}, "default": {}},
        {"name": "Raw", "type": "bytes", "default": ""},
    ],
}


def test_nested_records_flatten_into_parent_child_columns():
    plan = plan_of(NESTED)
    assert plan.arrow_schema.names[:-3] == [
        "Id",
        "Location_Lat",
        "Location_Lon",
        "Location_Alt",
        "Backup_Lat",
        "Backup_Lon",
        "Backup_Alt",
        "Readings_t",
        "Readings_v",
        "Readings_ok",
        "Kind",
        "Tags",
        "Raw",
    ]
    event = {
        "Id": "st-1",
        "Location": {"Lat": 52.5, "Lon": 13.4},
        "Readings": [{"t": 1, "v": 0.5}, {"t": 2, "v": 0.75, "ok": False}],
        "Kind": "B",
        "Tags": {"zone": "north"},
        "Raw": "\u00ff\u0001",
    }
    rows = flatten(plan, events_of(encode(event))).rows.to_pylist()
    assert [(r["Readings_t"], r["Readings_v"], r["Readings_ok"]) for r in rows] == [
        (1, 0.5, True),
        (2, 0.75, False),
    ]
    assert rows[0]["Location_Lat"] == 52.5 and rows[0]["Location_Alt"] is None
    assert rows[0]["Backup_Lat"] is None
    assert json.loads(rows[0]["Tags"]) == {"zone": "north"}
    assert rows[0]["Raw"] == b"\xff\x01"
    assert rows[1]["Kind"] == "B"


def test_optional_fields_accept_plain_json_values_and_null():
    plan = plan_of(NESTED)
    base = {"Id": "a", "Location": {"Lat": 1, "Lon": 2}, "Readings": [], "Kind": "A"}
    plain = {**base, "Backup": {"Lat": 3, "Lon": 4, "Alt": 5}, "Readings": [{"t": 1, "v": 1}]}
    null = {**base, "Backup": None, "Readings": [{"t": 1, "v": 1}]}
    rows = flatten(plan, events_of(encode(plain, null))).rows.to_pylist()
    assert (rows[0]["Backup_Lat"], rows[0]["Backup_Alt"]) == (3.0, 5.0)
    assert rows[1]["Backup_Lat"] is None


def test_wrong_enum_symbol_is_quarantined():
    plan = plan_of(NESTED)
    event = {"Id": "a", "Location": {"Lat": 1, "Lon": 2}, "Readings": [], "Kind": "C"}
    [bad] = quarantined(plan, encode(event))
    assert bad["reason"].startswith("wrong type") and "$.Kind" in bad["reason"]


def test_int_fields_are_range_checked():
    schema = {
        "type": "record",
        "name": "Small",
        "fields": [{"name": "Counts", "type": {"type": "array", "items": "int"}}],
    }
    plan = plan_of(schema)
    result = flatten(plan, events_of(encode({"Counts": [1, 2**31 - 1]}, {"Counts": [2**31]})))
    assert result.rows.column("Counts").to_pylist() == [1, 2**31 - 1]
    assert result.rows.schema.field("Counts").type == pa.int32()
    assert result.quarantine.column("reason").to_pylist()[0].startswith("wrong type")


def test_fast_and_strict_paths_agree_on_awkward_numbers(nic):
    """JSON numbers numpy would read differently go through the strict decoder."""
    awkward = [
        nic_event(0, RxBytes=[0, -0, 9223372036854775807, -9223372036854775808]),
        nic_event(0, RxBytes=[1, 2, 3, 4], TxBytes=[1, 2, 3, 4]),
    ]
    spaced = (
        b'{"RemoteAddr":"a","Interface":"b","TimestampNanos":[ 1 , 2 ],'
        b'"RxBytes":[1,2],"TxBytes":[ 3,4 ]}'
    )
    exponent = (
        b'{"RemoteAddr":"a","Interface":"b","TimestampNanos":[1e3],"RxBytes":[1],"TxBytes":[1]}'
    )
    leading_zero = (
        b'{"RemoteAddr":"a","Interface":"b","TimestampNanos":[1],"RxBytes":[01],"TxBytes":[1]}'
    )
    payloads = [*encode(*awkward), spaced, exponent, leading_zero]
    result = flatten(nic, events_of(payloads))
    rx = result.rows.column("RxBytes").to_pylist()
    assert rx[:4] == [0, 0, 9223372036854775807, -9223372036854775808]
    assert result.rows.filter(pa.compute.equal(result.rows["_offset"], 200)).column(
        "TxBytes"
    ).to_pylist() == [3, 4]
    reasons = result.quarantine.column("reason").to_pylist()
    assert reasons[0].startswith("wrong type") and reasons[1].startswith("invalid JSON")


def test_event_time_falls_back_to_ingest_time_without_a_time_column():
    schema = {"type": "record", "name": "Plain", "fields": [{"name": "v", "type": "long"}]}
    result = flatten(plan_of(schema), events_of(encode({"v": 1}, {"v": 2})))
    assert result.time_ns.tolist() == [1_700_000_000_000_000_000, 1_700_000_000_000_000_001]
    assert isinstance(result.time_ns, np.ndarray)


def test_events_from_the_sluice_source_columns():
    batch = pa.RecordBatch.from_pydict(
        {
            "stream": ["s/x"],
            "segment": pa.array([1], pa.int32()),
            "offset": pa.array([64], pa.int64()),
            "routing_key": ["k"],
            "payload": pa.array([b"{}"], pa.binary()),
            "ingest_time": pa.array([1_000_000], pa.timestamp("us", tz="UTC")),
        }
    )
    events = Events.from_arrow(batch)
    assert (events.stream, events.segments, events.offsets) == ("s/x", [1], [64])
    assert events.ingest_ns == [1_000_000_000]


@pytest.mark.parametrize(
    "rx",
    ["[1,2.5]", "[1,true]", '[1,"2"]', "[1,null]", "[1,[2]]", "[1,{}]", "[2,1E2]", "[1,-]"],
)
def test_anything_but_whole_numbers_in_a_long_array_is_refused(nic, rx):
    head = '{"RemoteAddr":"a","Interface":"b","TimestampNanos":[1,2],"RxBytes":'
    payload = f'{head}{rx},"TxBytes":[1,2]}}'.encode()
    result = flatten(nic, events_of([payload]))
    assert result.rows.num_rows == 0
    [reason] = result.quarantine.column("reason").to_pylist()
    assert reason.startswith(("wrong type", "invalid JSON")), reason


# --- all at once: a batch gives the same rows as its events one at a time ----------------------

BLANK = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])
PLAIN_LONGS = st.one_of(st.integers(-(2**63) + 1, 2**63 - 2), st.integers(-1000, 10**12)).map(str)
LONGS = st.one_of(
    PLAIN_LONGS,
    PLAIN_LONGS,
    PLAIN_LONGS,
    st.sampled_from(
        ["-0", "9223372036854775807", "-9223372036854775808", "9223372036854775808", "1.0",
         "1e3", "2147483648", "-2147483649", '"7"', "null", "[1]", "{}"]
    ),
)  # fmt: skip
PLAIN_DOUBLES = st.floats(allow_nan=False, allow_infinity=False).map(repr)
DOUBLES = st.one_of(
    PLAIN_DOUBLES,
    PLAIN_DOUBLES,
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(["1e400", "-1e400", "-0.0", "1E-400", "0.1", "true"]),
)


@st.composite
def json_arrays(draw: st.DrawFn, items: dict[str, st.SearchStrategy[str]]) -> str:
    """Parallel JSON arrays (name -> strategy of its items' text), mostly of one length, spaced
    the ways JSON allows, some empty, some of another length, some a string instead."""
    size = draw(st.integers(0, 4))
    fields = []
    for name, item in items.items():
        length = max(0, size + draw(st.sampled_from([0] * 8 + [1, -1])))
        values = draw(st.lists(item, min_size=length, max_size=length))
        inner = ",".join(f"{draw(BLANK)}{v}{draw(BLANK)}" for v in values) or draw(BLANK)
        text = draw(st.sampled_from([f"[{inner}]"] * 5 + [f'"{inner}"']))
        fields.append(f'"{name}":{text}')
    return ",".join(fields)


def one_bad_event_changes_nothing_for_the_others(plan: FlattenPlan, payloads: list[bytes]):
    """A batch flattens all at once when it can; with a bad event added it goes one event at
    a time. The rows, event times and quarantine of the batch's events must be the same."""
    batch = flatten(plan, events_of(payloads))
    mixed = flatten(plan, events_of([*payloads, b"{not json"]))
    assert batch.rows.schema == mixed.rows.schema
    assert batch.rows.to_pylist() == mixed.rows.to_pylist()
    assert batch.time_ns.tolist() == mixed.time_ns.tolist()
    assert batch.quarantine.to_pylist() == mixed.quarantine.to_pylist()[:-1]
    dictionaries = flatten(plan, events_of(payloads), dictionary=True)
    assert dictionaries.rows.to_pylist() == batch.rows.to_pylist()


def json_reads(payload: bytes, arrays: dict[str, str]) -> list[tuple] | None:
    """The rows Python's json module reads from an event's parallel arrays (name -> "long" or
    "double"): a reading of the numbers independent of the flatten's parsers. None when the
    event must be refused: not JSON, an array that is not a list of numbers of its type (whole
    numbers within int64 for a long, finite for a double) or arrays of unequal lengths."""
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        return None
    columns = []
    for name, kind in arrays.items():
        values = event[name]
        if not isinstance(values, list):
            return None
        if kind == "long":
            if not all(type(v) is int and -(2**63) <= v < 2**63 for v in values):
                return None
        elif not all(type(v) in (int, float) and math.isfinite(v) for v in values):
            return None
        columns.append([v if kind == "long" else float(v) for v in values])
    if len({len(column) for column in columns}) > 1:
        return None
    return list(zip(*columns, strict=True))


def read_as_json_reads_them(plan: FlattenPlan, payloads: list[bytes], arrays: dict[str, str]):
    """The batch's rows are exactly the numbers Python's json module reads, and exactly the
    events it refuses are quarantined."""
    expected = [json_reads(payload, arrays) for payload in payloads]
    result = flatten(plan, events_of(payloads))
    columns = [result.rows.column(name).to_pylist() for name in arrays]
    assert list(zip(*columns, strict=True)) == [row for e in expected if e is not None for row in e]
    refused = [100 * i for i, e in enumerate(expected) if e is None]
    assert result.quarantine.column("_offset").to_pylist() == refused


NETWORK = {"TimestampNanos": LONGS, "RxBytes": LONGS, "TxBytes": LONGS}
ACCELEROMETER = {"TimestampNanos": LONGS, "X": DOUBLES, "Y": DOUBLES, "Z": DOUBLES}


@settings(max_examples=300, deadline=None)
@given(st.lists(json_arrays(NETWORK), max_size=4))
def test_a_batch_of_network_events_flattens_as_its_events_one_at_a_time(arrays):
    payloads = [f'{{"RemoteAddr":"a","Interface":"b",{a}}}'.encode() for a in arrays]
    plan = flatten_plan("NetworkSamples")
    one_bad_event_changes_nothing_for_the_others(plan, payloads)
    read_as_json_reads_them(plan, payloads, dict.fromkeys(NETWORK, "long"))


@settings(max_examples=300, deadline=None)
@given(st.lists(json_arrays(ACCELEROMETER), max_size=4))
def test_a_batch_of_double_arrays_flattens_as_its_events_one_at_a_time(arrays):
    payloads = [f'{{"RemoteAddr":"a",{a}}}'.encode() for a in arrays]
    plan = flatten_plan("AccelerometerSamples")
    one_bad_event_changes_nothing_for_the_others(plan, payloads)
    kinds = {"TimestampNanos": "long", "X": "double", "Y": "double", "Z": "double"}
    read_as_json_reads_them(plan, payloads, kinds)


@pytest.mark.parametrize(
    ("field", "text", "rows"),
    [
        ("TxBytes", '"1,2"', 0),  # a string of numbers is not an array
        ("TxBytes", "[ 1,2]", 2),
        ("TxBytes", "[1 , 2 ]", 2),
        ("TxBytes", "[\n1,2]", 2),
        ("RxBytes", "[ ]", 0),  # numpy would read a blank item as 0: unequal arrays
        ("RxBytes", "[]", 0),
        ("RxBytes", "[1,9223372036854775807]", 2),
        ("RxBytes", "[1,9223372036854775808]", 0),
    ],
)
def test_awkward_arrays_among_plain_events(field, text, rows):
    """Plain events around one awkward array: the same answer as that event alone."""
    base = {"RemoteAddr": "a", "Interface": "b", "TimestampNanos": [1, 2], "RxBytes": [3, 4]}
    plain = {**base, "TxBytes": [5, 6]}
    awkward = json.dumps({**plain, field: 0}).replace(f'"{field}": 0', f'"{field}": {text}')
    nic = flatten_plan("NetworkSamples")
    payloads = [*encode(plain), awkward.encode(), *encode(plain)]
    result = flatten(nic, events_of(payloads))
    alone = flatten(nic, events_of([payloads[1]]))
    assert alone.rows.num_rows == rows
    assert result.rows.num_rows == 4 + rows
    middle = result.rows.filter(pa.compute.equal(result.rows["_offset"], 100))
    expected = alone.rows.drop_columns(["_offset"]).to_pylist()
    assert middle.drop_columns(["_offset"]).to_pylist() == expected
    reasons = [q["reason"] for q in alone.quarantine.to_pylist()]
    assert [q["reason"] for q in result.quarantine.to_pylist()] == reasons


def test_dictionary_columns_hold_each_distinct_value_once(nic):
    events = events_of(encode(nic_event(0), nic_event(1, Interface="ens34"), nic_event(2)))
    plain = flatten(nic, events)
    coded = flatten(nic, events, dictionary=True)
    assert coded.rows.cast(plain.rows.schema).equals(plain.rows)
    sizes = {
        name: len(coded.rows.column(name).chunk(0).dictionary)
        for name in ("RemoteAddr", "Interface", "_segment", "_offset")
    }
    assert sizes == {"RemoteAddr": 1, "Interface": 2, "_segment": 1, "_offset": 3}


# --- whole events: simdjson reads the scalars as msgspec decodes them ---------------------------

SCALARS = {
    "type": "record",
    "name": "Scalars",
    "fields": [
        {"name": "Name", "type": "string"},
        {"name": "On", "type": "boolean"},
        {"name": "Small", "type": "int"},
        {"name": "Big", "type": "long"},
        {"name": "Level", "type": "double"},
        {"name": "Gain", "type": "float"},
        {
            "name": "Where",
            "type": {
                "type": "record",
                "name": "Where",
                "fields": [
                    {"name": "Site", "type": "string"},
                    {"name": "Lat", "type": "double"},
                ],
            },
        },
        {"name": "T", "type": {"type": "array", "items": "long"}},
        {"name": "V", "type": {"type": "array", "items": "double"}},
    ],
}
OTHERS = st.sampled_from(["null", "true", "1", "1.0", '"1"', "[]", "{}"])
PLAIN_STRINGS = st.one_of(
    st.text().map(json.dumps),
    st.text().map(lambda s: json.dumps(s, ensure_ascii=False)),
    st.sampled_from(['"a"', '"\\u00e9\\ud83d\\ude00"', '"tab\\there"']),
)
#: Each scalar of `SCALARS` as JSON text, as a collector writes it.
PLAIN = {
    "Name": PLAIN_STRINGS,
    "On": st.sampled_from(["true", "false"]),
    "Small": st.integers(-(2**31), 2**31 - 1).map(str),
    "Big": PLAIN_LONGS,
    "Level": st.one_of(
        PLAIN_DOUBLES, st.sampled_from(["0", "-0", "1", "-0.0", "9007199254740993", "1" * 30])
    ),
    "Gain": PLAIN_DOUBLES,
}
#: ... and as it should not: a wrong type, out of range, not JSON (a lone surrogate).
AWKWARD = {
    "Name": st.one_of(OTHERS, st.just('"\\ud800"')),
    "On": st.sampled_from(["0", "1", "null", '"true"']),
    "Small": st.one_of(
        st.sampled_from(["-0", "1.0", "true", "2147483648", "-2147483649"]),
        st.integers(-(2**40), 2**40).map(str),
    ),
    "Big": LONGS,
    "Level": st.one_of(DOUBLES, OTHERS),
    "Gain": st.one_of(DOUBLES, OTHERS),
}
CHANGES = ["none"] * 5 + ["awkward", "awkward", "missing", "twice", "unknown", "where"]


@st.composite
def scalar_events(draw: st.DrawFn) -> bytes:
    """An event of `SCALARS` as JSON text: plain, or with one change: a scalar awkward, a
    field missing, twice (another value: msgspec keeps the last) or unknown, or `Where` not
    an object, missing a field or with a key twice."""
    fields = {name: draw(text) for name, text in PLAIN.items()}
    site, lat = draw(PLAIN_STRINGS), draw(PLAIN_DOUBLES)
    fields["Where"] = f'{{"Site":{site},"Lat":{lat}}}'
    size = draw(st.integers(0, 3))
    fields["T"] = "[" + ",".join(str(10 * k) for k in range(size)) + "]"
    fields["V"] = "[" + ",".join(f"{k}.5" for k in range(size)) + "]"
    items = list(fields.items())
    change, name = draw(st.sampled_from(CHANGES)), draw(st.sampled_from(sorted(fields)))
    scalar = draw(st.sampled_from(sorted(PLAIN)))
    if change == "awkward":
        fields[scalar] = draw(AWKWARD[scalar])
        items = list(fields.items())
    elif change == "missing":
        items = [(k, v) for k, v in items if k != name]
    elif change == "twice":
        items.append((scalar, draw(st.one_of(PLAIN[scalar], AWKWARD[scalar]))))
    elif change == "unknown":
        items.insert(draw(st.integers(0, len(items))), ("Unknown", draw(PLAIN_STRINGS)))
    elif change == "where":
        fields["Where"] = draw(
            st.sampled_from(
                [
                    f'{{"Lat":{lat},"Site":{site},"Extra":{{"x":null}}}}',
                    f'{{"Site":{site},"Lat":{lat},"Site":"again"}}',
                    f'{{"Site":{site}}}',
                    "null",
                ]
            )
        )
        items = list(fields.items())
    return ("{" + ",".join(f'"{k}":{v}' for k, v in items) + "}").encode()


def without_whole_events(plan: FlattenPlan, payloads: list[bytes]):
    """The batch flattened with msgspec's decode and the arrays' parse, as before whole
    events were read."""
    with mock.patch.object(flatten_module, "_read_whole", lambda plan, payloads: None):
        return flatten(plan, events_of(payloads))


@settings(max_examples=500, deadline=None)
@given(st.lists(scalar_events(), min_size=1, max_size=3))
def test_whole_events_read_the_scalars_as_msgspec_decodes_them(payloads):
    """Whatever the scalars hold, the batch gives the rows (repr: -0.0 is not 0.0), event times
    and quarantine it gives without whole events, and those of its events one at a time."""
    plan = plan_of(SCALARS)
    batch, before = flatten(plan, events_of(payloads)), without_whole_events(plan, payloads)
    assert repr(batch.rows.to_pylist()) == repr(before.rows.to_pylist())
    assert batch.time_ns.tolist() == before.time_ns.tolist()
    assert batch.quarantine.to_pylist() == before.quarantine.to_pylist()
    one_bad_event_changes_nothing_for_the_others(plan, payloads)


def test_plain_events_are_read_whole(nic):
    """The path the export takes for the bundled schemas' events (and `SCALARS`' plain ones)."""
    payloads = encode(nic_event(0), nic_event(1, Extra={"a": [1, 2]}))
    assert flatten_module._read_whole(nic, payloads) is not None
    plain = {
        "Name": "n", "On": True, "Small": -5, "Big": 2**62, "Level": 3, "Gain": 0.5,
        "Where": {"Site": "s", "Lat": 1.5}, "T": [1, 2], "V": [0.5, 1],
    }  # fmt: skip
    scalars = plan_of(SCALARS)
    assert flatten_module._read_whole(scalars, encode(plain)) is not None
    rows = flatten(scalars, events_of(encode(plain))).rows.to_pylist()
    expected = [(3.0, 1.5, 0.5), (3.0, 1.5, 1.0)]
    assert [(r["Level"], r["Where_Lat"], r["V"]) for r in rows] == expected
    for awkward in ({**plain, "Where": None}, {**plain, "On": 1}, {**plain, "Small": 2**31}):
        assert flatten_module._read_whole(scalars, encode(awkward)) is None
