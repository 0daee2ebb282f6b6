"""Avro's resolution rules between the schema of an export's earlier runs and a new one."""

from __future__ import annotations

import json

import pytest

from pipeline.schemas import parse_schema_text
from pipeline.schemas.evolution import Incompatible, incompatibilities

SITE = {"name": "site", "type": "string"}
X = {"name": "x", "type": "int"}
TIMES = {"name": "tNanos", "type": {"type": "array", "items": "long"}}
OLD = [SITE, X, TIMES]


def changes(new_fields: list[dict], old_fields: list[dict] = OLD, **top: object):
    old = parse_schema_text(json.dumps({"type": "record", "name": "T", "fields": old_fields}))
    text = json.dumps({"type": "record", "name": "T", "fields": new_fields, **top}, indent=3)
    return incompatibilities(old, parse_schema_text(text))


@pytest.mark.parametrize(
    "new",
    [
        pytest.param(OLD, id="the same schema reformatted"),
        pytest.param([{**SITE, "doc": "where"}, X, TIMES], id="a doc added"),
        pytest.param([TIMES, X, SITE], id="fields in another order"),
        pytest.param([SITE, {"name": "n", "type": "long", "default": 0}, X, TIMES], id="added"),
        pytest.param(
            [SITE, X, TIMES, {"name": "n", "type": ["null", "long"], "default": None}],
            id="optional field added",
        ),
        pytest.param([SITE, {"name": "x", "type": "long"}, TIMES], id="int to long"),
        pytest.param([SITE, {"name": "x", "type": "double"}, TIMES], id="int to double"),
        pytest.param([SITE, {"name": "x", "type": ["null", "int"]}, TIMES], id="made optional"),
        pytest.param([SITE, TIMES], id="a field removed"),
        pytest.param(
            [SITE, X, {"name": "tNanos", "type": {"type": "array", "items": "double"}}],
            id="array of long to double",
        ),
    ],
)
def test_a_compatible_change_has_nothing_to_say(new):
    assert changes(new, doc="version 2") == []


def test_a_float_widened_to_double_is_compatible():
    old = [SITE, {"name": "x", "type": "float"}, TIMES]
    assert changes([SITE, {"name": "x", "type": "double"}, TIMES], old) == []


def test_each_incompatible_change_names_its_field():
    loc = {"name": "loc", "type": {"type": "record", "name": "L", "fields": [X]}}
    new_loc = {
        "name": "loc",
        "type": {"type": "record", "name": "L", "fields": [{"name": "x", "type": "string"}]},
    }
    found = changes(
        [
            {"name": "location", "type": "string", "aliases": ["site"], "default": "?"},
            {"name": "x", "type": ["null", "long"]},
            TIMES,
            {"name": "m", "type": "long"},
            new_loc,
        ],
        [{"name": "site", "type": "string"}, {"name": "x", "type": ["null", "int"]}, TIMES, loc],
    )
    assert [(c.field, c.reason.split(":")[0]) for c in found] == [
        ("location", "renames field 'site' (an alias)"),
        ("m", "is new and has no default"),
        ("loc_x", "changes type from int to string, which Avro does not promote"),
    ]
    required = changes(
        [SITE, {"name": "x", "type": "int"}, TIMES], [SITE, {**X, "type": ["null", "int"]}, TIMES]
    )
    assert required == [
        Incompatible(
            "x", "was optional and is now required: events that hold null would be quarantined"
        )
    ]


def test_an_enum_that_loses_a_symbol_is_incompatible_unless_it_has_a_default():
    def enum(*symbols: str, **default: str) -> list[dict]:
        kind = {"type": "enum", "name": "E", "symbols": list(symbols), **default}
        return [SITE, {"name": "e", "type": kind}, TIMES]

    assert changes(enum("A", "B", "C"), enum("A", "B")) == []
    assert [c.field for c in changes(enum("A"), enum("A", "B"))] == ["e"]
    assert changes(enum("A", default="A"), enum("A", "B")) == []


def test_an_array_added_with_an_empty_default_leaves_older_events_null_not_quarantined():
    from pipeline.schemas import Events, FlattenPlan, flatten

    temp = {"name": "temp", "type": {"type": "array", "items": "double"}, "default": []}
    text = json.dumps({"type": "record", "name": "T", "fields": [SITE, TIMES, temp]})
    plan = FlattenPlan(parse_schema_text(text))
    payloads = [
        {"site": "old", "tNanos": [1, 2]},  # written before temp was added
        {"site": "new", "tNanos": [3, 4], "temp": [0.5, 1.5]},
        {"site": "bad", "tNanos": [5], "temp": []},  # an empty array held is no absent one
    ]
    raw = [json.dumps(p).encode() for p in payloads]
    whole = flatten(plan, Events("s/t", raw, [0] * 3, [0, 1, 2], ["k"] * 3, [0] * 3))
    columns = ("site", "tNanos", "temp")
    assert [tuple(r[c] for c in columns) for r in whole.rows.to_pylist()] == [
        ("old", 1, None),
        ("old", 2, None),
        ("new", 3, 0.5),
        ("new", 4, 1.5),
    ]
    assert whole.rows.schema.field("temp").nullable
    assert whole.quarantine.column("reason").to_pylist() == [
        "unequal arrays: tNanos has 1, temp has 0 items (schema T)"
    ]
    alone = flatten(plan, Events("s/t", raw[:1], [0], [0], ["k"], [0]))
    assert alone.rows.column("temp").to_pylist() == [None, None]
