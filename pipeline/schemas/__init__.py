"""Avro schemas (parsed with fastavro) -> flat Arrow/Spark tables, with quarantine for bad events.

plan = flatten_plan("NetworkSamples")          # or a path to an .avsc file
plan.arrow_schema / plan.spark_schema()        # the flat table's columns + lineage
result = flatten(plan, Events.from_arrow(batch))
result.rows, result.quarantine                 # rows; bad events with their reasons
"""

from __future__ import annotations

from pipeline.schemas.avro import AvroSchema, bundled_schemas, load_schema, parse_schema_text
from pipeline.schemas.errors import InvalidSchema, SchemaError, SchemaNotFound, UnsupportedSchema
from pipeline.schemas.flatten import flatten
from pipeline.schemas.plan import LINEAGE, Column, FlattenPlan, TimeColumn, flatten_plan
from pipeline.schemas.tables import QUARANTINE_SCHEMA, Events, Flattened, quarantine_columns

__all__ = [
    "LINEAGE",
    "QUARANTINE_SCHEMA",
    "AvroSchema",
    "Column",
    "Events",
    "FlattenPlan",
    "Flattened",
    "InvalidSchema",
    "SchemaError",
    "SchemaNotFound",
    "TimeColumn",
    "UnsupportedSchema",
    "bundled_schemas",
    "flatten",
    "flatten_plan",
    "load_schema",
    "parse_schema_text",
    "quarantine_columns",
]
