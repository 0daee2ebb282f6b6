"""Schemas: the bundled .avsc files, loading, and what cannot be flattened (typed errors)."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.schemas import (
    InvalidSchema,
    SchemaNotFound,
    UnsupportedSchema,
    bundled_schemas,
    flatten_plan,
    load_schema,
    parse_schema_text,
    quarantine_columns,
)
from pipeline.schemas.plan import LINEAGE_DOC, FlattenPlan

SEEDS = Path(__file__).resolve().parents[3] / "shared" / "seeds"


def test_bundled_schemas():
    assert bundled_schemas() == ("AccelerometerSamples", "GeneratorSamples", "NetworkSamples")
    for name in bundled_schemas():
        plan = flatten_plan(name)
        assert plan.time is not None and plan.time.name == "TimestampNanos"


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seeds are not next to this checkout")
def test_network_samples_is_the_seeds_schema_with_docs():
    seed = next(SEEDS.glob("000_*.txt")).read_text()
    start = seed.rindex("{", 0, seed.index('"namespace": "io.pravega.flinktools.util"'))
    text = json.dumps(json.JSONDecoder().raw_decode(seed, start)[0])
    # The fingerprint is of the Parsing Canonical Form, which leaves out the docs.
    assert load_schema("NetworkSamples").fingerprint == parse_schema_text(text).fingerprint


@pytest.mark.parametrize("name", bundled_schemas())
def test_every_column_of_a_bundled_schema_is_described(name):
    fields = load_schema(name).parsed["fields"]
    assert all(f.get("doc") for f in fields), [f["name"] for f in fields if not f.get("doc")]
    described = {c["name"]: c["description"] for c in flatten_plan(name).describe()}
    assert all(described.values()), described
    assert set(LINEAGE_DOC) <= set(described)
    assert all(c["description"] for c in quarantine_columns())


def test_a_nested_field_without_doc_takes_its_enclosing_fields():
    inner = {"type": "record", "name": "Pos", "fields": [{"name": "x", "type": "double"}]}
    schema = {
        "type": "record",
        "name": "Outer",
        "fields": [
            {"name": "pos", "type": inner, "doc": "where it was"},
            {"name": "id", "type": "string", "doc": "which one"},
            {"name": "plain", "type": "int"},
        ],
    }
    plan = FlattenPlan(parse_schema_text(json.dumps(schema)))
    described = {c["name"]: c["description"] for c in plan.describe()}
    assert described["pos_x"] == "where it was"
    assert (described["id"], described["plain"]) == ("which one", "")
    assert described["_sample"] == LINEAGE_DOC["_sample"]


def test_load_by_path_and_by_name(tmp_path):
    path = tmp_path / "Mine.avsc"
    path.write_text(json.dumps({"type": "record", "name": "Mine", "fields": []}))
    assert load_schema(path).name == "Mine"
    assert load_schema(str(path)).source == str(path)
    assert load_schema("NetworkSamples.avsc").name == "NetworkSamples"


def test_unknown_schema_names_the_bundled_ones():
    with pytest.raises(SchemaNotFound, match=re.escape("NetworkSamples")):
        load_schema("NoSuchSchema")


def test_invalid_avro_is_refused(tmp_path):
    with pytest.raises(InvalidSchema, match="not JSON"):
        parse_schema_text("{nope", "x.avsc")
    bad_type = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "strnig"}]}
    with pytest.raises(InvalidSchema, match=re.escape("x.avsc")):
        parse_schema_text(json.dumps(bad_type), "x.avsc")
    with pytest.raises(InvalidSchema, match="top-level type must be a record"):
        parse_schema_text('"string"', "x.avsc")


def _plan(fields: list[dict]) -> FlattenPlan:
    schema = {"type": "record", "name": "R", "fields": fields}
    return FlattenPlan(parse_schema_text(json.dumps(schema), "r.avsc"))


def test_nested_arrays_cannot_be_flattened():
    nested = {"type": "array", "items": {"type": "array", "items": "long"}}
    with pytest.raises(UnsupportedSchema, match="an array inside a parallel array"):
        _plan([{"name": "a", "type": nested}])


def test_unions_of_several_types_cannot_be_flattened():
    with pytest.raises(UnsupportedSchema, match="several non-null types"):
        _plan([{"name": "a", "type": ["null", "long", "string"]}])


def test_colliding_column_names_are_refused():
    inner = {"type": "record", "name": "b", "fields": [{"name": "c", "type": "long"}]}
    with pytest.raises(UnsupportedSchema, match=re.escape("'a_b_c'")):
        _plan([{"name": "a_b_c", "type": "long"}, {"name": "a_b", "type": inner}])
    with pytest.raises(UnsupportedSchema, match="lineage column"):
        _plan([{"name": "_offset", "type": "long"}])


def test_time_column_from_logical_type_and_explicit_field():
    ts = {"type": "long", "logicalType": "timestamp-millis"}
    plan = _plan([{"name": "at", "type": ts}, {"name": "EventTimeNanos", "type": "long"}])
    assert (plan.time.name, plan.time.ns_per_unit) == ("at", 1_000_000)
    chosen = _explicit(plan, "EventTimeNanos").time
    assert (chosen.name, chosen.ns_per_unit) == ("EventTimeNanos", 1)


def _explicit(plan: FlattenPlan, field: str) -> FlattenPlan:
    return FlattenPlan(plan.schema, time_field=field)


def test_explicit_time_field_must_be_an_integer_column_with_a_unit():
    plan = _plan([{"name": "n", "type": "long"}, {"name": "s", "type": "string"}])
    assert plan.time is None
    with pytest.raises(UnsupportedSchema, match="logicalType"):
        _explicit(plan, "n")
    with pytest.raises(UnsupportedSchema, match="no integer column"):
        _explicit(plan, "s")


def test_arrow_and_spark_schemas():
    plan = flatten_plan("AccelerometerSamples")
    schema = plan.arrow_schema
    assert schema.field("X").type == pa.float64()
    assert schema.field("LastTimestampFormatted").nullable
    assert not schema.field("RemoteAddr").nullable
    spark = plan.spark_schema()
    assert spark.fieldNames() == schema.names
    assert spark["TimestampNanos"].dataType.simpleString() == "bigint"
    assert spark["_segment"].dataType.simpleString() == "int"


def test_plans_travel_to_executors_by_their_schema_text():
    plan = flatten_plan("GeneratorSamples")
    copy = pickle.loads(pickle.dumps(plan))
    assert copy.arrow_schema == plan.arrow_schema
    assert copy.schema.fingerprint == plan.schema.fingerprint
