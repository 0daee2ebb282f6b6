"""Flatten plans: how an Avro record schema becomes one flat table.

Array fields are parallel arrays (one row per index, equal lengths or the event is
quarantined), scalars repeat on each row, nested records become `parent_child` columns,
defaults fill fields older events lack; every table carries the lineage columns `_segment`,
`_offset` and `_sample`. A plan is rebuilt in each executor from the schema text
(`FlattenPlan.__reduce__`), because its decoders are classes made at run time. All the
rules: `DESIGN.md`."""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import pyarrow as pa

from pipeline.schemas.avro import AvroSchema, load_schema, parse_schema_text
from pipeline.schemas.errors import UnsupportedSchema

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

Kind = Literal["scalar", "sample"]

LINEAGE = (("_segment", pa.int32()), ("_offset", pa.int64()), ("_sample", pa.int32()))
#: What each lineage column holds (the column descriptions of an export's schema).
LINEAGE_DOC = {
    "_segment": "segment of the source stream that holds the row's event",
    "_offset": "byte offset of the row's event in its segment (with _segment: the event's "
    "position in the stream)",
    "_sample": "index of the row within its event (0 for the event's first sample)",
}
NUMERIC = ("int", "long", "float", "double")
_ARROW = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "enum": pa.string(),
    "map": pa.string(),
    "bytes": pa.binary(),
    "fixed": pa.binary(),
}
_INT = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
_LONG = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
#: The largest 32-bit float: an Avro float beyond it would be written as infinity.
FLOAT32_MAX = 3.4028234663852886e38
_FLOAT = Annotated[float, msgspec.Meta(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
_SIMPLE: dict[str, Any] = {
    "null": None,
    "boolean": bool,
    "int": _INT,
    "long": _LONG,
    "float": _FLOAT,
    "double": float,
    "string": str,
    "bytes": str,  # Avro's JSON encoding: one character U+0000..U+00FF per byte
}
_TIME_UNITS = {"timestamp-nanos": 1, "timestamp-micros": 1_000, "timestamp-millis": 1_000_000}
_TIME_SUFFIXES = (("nanos", 1), ("micros", 1_000), ("millis", 1_000_000))
#: Avro's rule for a field name (also a plain identifier in Parquet, CSV, DuckDB and Spark).
_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The export's hive partition columns: DuckDB's `hive_partitioning` would read their values
#: from the directory names instead of a data column of the same name.
PARTITIONS = ("date", "hour")
#: The source of a plan made from a schema's text (`flatten_plan`).
SCHEMA_TEXT = "<schema text>"


@dataclass(frozen=True, slots=True)
class Column:
    """One output column of the flat table.

    `path` is the attribute path of the value in a decoded event (for a sample column: in one
    array element; empty for an array of primitives). `array_path` is the path of the parallel
    array a sample column comes from.
    """

    name: str
    avro: str
    kind: Kind
    nullable: bool
    path: tuple[str, ...]
    array_path: tuple[str, ...] = ()
    logical: str | None = None
    doc: str = ""  # the Avro field's `doc` (else the nearest enclosing field's)

    @property
    def arrow_type(self) -> pa.DataType:
        return _ARROW[self.avro]

    @property
    def array_name(self) -> str:
        return "_".join(self.array_path)


@dataclass(frozen=True, slots=True)
class TimeColumn:
    """The column that holds a row's event time, and its unit (nanoseconds per unit)."""

    name: str
    ns_per_unit: int


@dataclass(slots=True)
class _Walk:
    """State of one walk over a schema: named types seen, columns made so far."""

    source: str
    named: dict[str, dict] = field(default_factory=dict)
    columns: list[Column] = field(default_factory=list)
    arrays: list[tuple[str, ...]] = field(default_factory=list)
    structs: dict[tuple[str, bool], type] = field(default_factory=dict)
    building: set[str] = field(default_factory=set)  # records being walked (no recursion)


class FlattenPlan:
    """The columns, Arrow schema and JSON decoders for one Avro schema (see module doc)."""

    def __init__(self, schema: AvroSchema, time_field: str | None = None) -> None:
        self.schema = schema
        self.time_field = time_field
        walk = _Walk(schema.source)
        self.strict_type = _record_type(walk, schema.parsed, fast=False)
        self.fast_type = _record_type(walk, schema.parsed, fast=True)
        _columns(walk, schema.parsed, prefix=(), path=(), array=None, nullable=False)
        self.columns: tuple[Column, ...] = tuple(walk.columns)
        self.arrays: tuple[tuple[str, ...], ...] = tuple(walk.arrays)
        #: arrays of numbers (Avro type per array path), which the fast decoder keeps raw
        self.number_arrays: dict[tuple[str, ...], str] = {
            c.array_path: c.avro
            for c in self.columns
            if c.kind == "sample" and not c.path and c.avro in NUMERIC
        }
        _check_names(schema.source, self.columns)
        self.time = _time_column(schema.source, self.columns, time_field)
        self.strict = msgspec.json.Decoder(self.strict_type)
        self.fast = msgspec.json.Decoder(self.fast_type)

    def __reduce__(self) -> tuple:
        return (_plan_from_text, (self.schema.text, self.schema.source, self.time_field))

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def arrow_schema(self) -> pa.Schema:
        """The flat table: data columns, then the lineage columns."""
        data = [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns]
        lineage = [pa.field(n, t, nullable=False) for n, t in LINEAGE]
        return pa.schema(data + lineage)

    def spark_schema(self) -> StructType:
        """The same table as a Spark schema (needs pyspark; used on the driver)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.arrow_schema)

    def describe(self) -> list[dict[str, Any]]:
        """Columns as plain dicts, for reports and catalogs; `description` is the Avro
        field's `doc` (a lineage column's: `LINEAGE_DOC`), empty when it has none."""
        return describe_fields(self.arrow_schema, {c.name: c.doc for c in self.columns})


def describe_fields(schema: pa.Schema, docs: dict[str, str]) -> list[dict[str, Any]]:
    """`schema`'s columns as plain dicts: name, type, nullable and description (from `docs`,
    else `LINEAGE_DOC`, else empty)."""
    docs = LINEAGE_DOC | docs
    return [
        {
            "name": f.name,
            "type": str(f.type),
            "nullable": f.nullable,
            "description": docs.get(f.name, ""),
        }
        for f in schema
    ]


@lru_cache(maxsize=32)
def _plan_from_text(text: str, source: str, time_field: str | None) -> FlattenPlan:
    """Executors rebuild each plan once per process (the decoders are made at run time)."""
    return FlattenPlan(parse_schema_text(text, source), time_field)


def flatten_plan(name_or_path: str, time_field: str | None = None) -> FlattenPlan:
    """The plan for a bundled schema name, an `.avsc` path or a schema's JSON text itself
    (`{…}`: how an export hands its tasks the schema its run checked, which its file may no
    longer hold by the time a later batch runs)."""
    if name_or_path.lstrip().startswith("{"):
        return _plan_from_text(name_or_path, SCHEMA_TEXT, time_field)
    schema = load_schema(name_or_path)
    return _plan_from_text(schema.text, schema.source, time_field)


# --- decoders: Avro types -> msgspec types ----------------------------------------------------


def _resolve(walk: _Walk, avro: Any) -> Any:
    """Follow a reference to a named type; remember named types at their definition."""
    if isinstance(avro, str) and avro in walk.named:
        return walk.named[avro]
    if isinstance(avro, dict) and avro.get("type") in ("record", "enum", "fixed"):
        walk.named.setdefault(avro["name"], avro)
    return avro


def _type_name(avro: Any) -> str:
    if isinstance(avro, list):
        return "union"
    return avro if isinstance(avro, str) else avro.get("type", "?")


def _msgspec_type(walk: _Walk, avro: Any, fast: bool, where: str) -> Any:
    """The decoding type; `fast` decodes arrays of numbers as raw JSON text (see flatten)."""
    avro = _resolve(walk, avro)
    if isinstance(avro, list):
        # msgspec.Raw cannot be one branch of a union: optional arrays decode strictly.
        branches = [_msgspec_type(walk, b, False, where) for b in avro]
        union = branches[0]
        for branch in branches[1:]:
            union = union | branch
        return union
    kind = _type_name(avro)
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if kind in ("array", "map"):
        return _container_type(walk, avro, fast, where)
    if kind == "record":
        return _record_type(walk, avro, fast)
    return _named_type(walk, avro, kind, where)


def _container_type(walk: _Walk, avro: dict, fast: bool, where: str) -> Any:
    if avro["type"] == "map":
        return dict[str, _msgspec_type(walk, avro["values"], fast, where)]
    items = _resolve(walk, avro["items"])
    if fast and _type_name(items) in NUMERIC:
        return msgspec.Raw
    return list[_msgspec_type(walk, items, fast, where)]


def _named_type(walk: _Walk, avro: dict, kind: str, where: str) -> Any:
    if kind == "enum":
        return Literal[tuple(avro["symbols"])]
    if kind == "fixed":
        return Annotated[str, msgspec.Meta(min_length=avro["size"], max_length=avro["size"])]
    raise UnsupportedSchema(walk.source, where, f"unknown Avro type {kind!r}")


def _record_type(walk: _Walk, record: dict, fast: bool) -> type:
    key = (record["name"], fast)
    if key in walk.structs:
        return walk.structs[key]
    walk.named.setdefault(record["name"], record)
    fields = []
    with _inside(walk, record):
        for avro_field in record["fields"]:
            name = _field_name(walk, avro_field)
            if _added_array(walk, avro_field):  # absent: None, its rows' values null
                kind = _msgspec_type(walk, avro_field["type"], False, name) | None
                fields.append((_attr(name), kind, msgspec.field(name=name, default=None)))
                continue
            kind = _msgspec_type(walk, avro_field["type"], fast, name)
            fields.append((_attr(name), kind, _default(walk, avro_field, kind)))
    struct_name = record["name"].replace(".", "_") + ("_fast" if fast else "")
    try:
        struct = msgspec.defstruct(struct_name, fields, kw_only=True)
        msgspec.json.Decoder(struct)
    except (TypeError, ValueError) as exc:
        raise UnsupportedSchema(walk.source, record["name"], str(exc)) from None
    walk.structs[key] = struct
    return struct


@contextmanager
def _inside(walk: _Walk, record: dict) -> Iterator[None]:
    """While a record's fields are walked: a record that holds itself has no flat form."""
    name = record["name"]
    if name in walk.building:
        reason = "the record holds itself (a recursive type has no flat form)"
        raise UnsupportedSchema(walk.source, name, reason)
    walk.building.add(name)
    try:
        yield
    finally:
        walk.building.discard(name)


def _field_name(walk: _Walk, avro_field: dict) -> str:
    """The field's name, checked against Avro's rule (fastavro does not check it)."""
    name = avro_field["name"]
    if not _AVRO_NAME.fullmatch(name):
        reason = "not an Avro name: a letter or _, then letters, digits and _ only"
        raise UnsupportedSchema(walk.source, name, reason)
    return name


def _added_array(walk: _Walk, avro_field: dict) -> bool:
    """Whether the field is an array whose default is empty: how Avro adds an array to a
    schema. A parallel array that takes `[]` beside the event's other arrays would make
    every event written before it unequal (quarantined); an event that lacks it has nulls in
    its columns instead (`DESIGN.md`). An empty array that an event holds is not absent."""
    default = avro_field.get("default")
    return default == [] and _type_name(_resolve(walk, avro_field["type"])) == "array"


def _attr(name: str) -> str:
    """A Python attribute for an Avro field name (`class` -> `class_`)."""
    return f"{name}_" if keyword.iskeyword(name) else name


def _default(walk: _Walk, avro_field: dict, kind: Any) -> Any:
    """A msgspec field: the Avro name, and the Avro default if the field has one."""
    name = avro_field["name"]
    if "default" not in avro_field:
        return msgspec.field(name=name)
    default = avro_field["default"]
    if isinstance(default, (dict, list)) or kind is msgspec.Raw:
        return msgspec.field(name=name, default_factory=_factory(default, kind))
    try:
        value = msgspec.convert(default, kind) if default is not None else None
    except msgspec.ValidationError as exc:
        raise UnsupportedSchema(walk.source, name, f"its default does not fit: {exc}") from None
    return msgspec.field(name=name, default=value)


def _factory(default: Any, kind: Any) -> Any:
    if kind is msgspec.Raw:
        raw = msgspec.Raw(msgspec.json.encode(default))
        return lambda: raw
    return lambda: msgspec.convert(default, kind)


# --- columns -----------------------------------------------------------------------------------


def _columns(
    walk: _Walk,
    avro: Any,
    *,
    prefix: tuple[str, ...],
    path: tuple[str, ...],
    array: tuple[str, ...] | None,
    nullable: bool,
    doc: str = "",
) -> None:
    """Append the columns of `avro` (found at `path`, named by `prefix`, described by the
    `doc` of its field) to `walk.columns`."""
    avro = _resolve(walk, avro)
    where = "_".join(prefix) or "<root>"
    if isinstance(avro, list):
        rest = [b for b in avro if _type_name(_resolve(walk, b)) != "null"]
        if len(rest) != 1:
            reason = "a union of several non-null types has no single column type"
            raise UnsupportedSchema(walk.source, where, reason)
        optional = len(rest) < len(avro) or nullable
        _columns(walk, rest[0], prefix=prefix, path=path, array=array, nullable=optional, doc=doc)
        return
    kind = _type_name(avro)
    if kind == "record":
        with _inside(walk, avro):
            for avro_field in avro["fields"]:
                name = avro_field["name"]
                sub = (*path, _attr(name))
                _columns(
                    walk,
                    avro_field["type"],
                    prefix=(*prefix, name),
                    path=sub,
                    array=array,
                    nullable=nullable or _added_array(walk, avro_field),
                    doc=avro_field.get("doc") or doc,
                )
        return
    if kind == "null":
        raise UnsupportedSchema(walk.source, where, "a field of type null holds no value")
    if kind == "array":
        if array is not None:
            reason = "an array inside a parallel array has no flat form"
            raise UnsupportedSchema(walk.source, where, reason)
        walk.arrays.append(path)
        _columns(
            walk, avro["items"], prefix=prefix, path=(), array=path, nullable=nullable, doc=doc
        )
        return
    logical = avro.get("logicalType") if isinstance(avro, dict) else None
    kind = "map" if kind == "map" else kind
    column = Column(
        name="_".join(prefix) or "value",
        avro=kind,
        kind="sample" if array is not None else "scalar",
        nullable=nullable,
        path=path,
        array_path=array or (),
        logical=logical,
        doc=doc,
    )
    walk.columns.append(column)


def _check_names(source: str, columns: tuple[Column, ...]) -> None:
    """Column names must differ, case aside (DuckDB and Spark ignore case), and be neither a
    lineage column nor a partition column."""
    seen: set[str] = set()
    lineage = {name for name, _ in LINEAGE}
    for column in columns:
        folded = column.name.lower()
        if folded in seen:
            reason = "two fields flatten to this column name (case aside); rename one"
            raise UnsupportedSchema(source, column.name, reason)
        if folded in lineage:
            raise UnsupportedSchema(source, column.name, "the name is a lineage column")
        if folded in PARTITIONS:
            reason = "the name is a partition column of the export (date=…/hour=…); rename it"
            raise UnsupportedSchema(source, column.name, reason)
        seen.add(folded)


def _time_column(
    source: str, columns: tuple[Column, ...], time_field: str | None
) -> TimeColumn | None:
    """The event-time column: named, else the first timestamp-typed, else `*Nanos` etc."""
    candidates = [c for c in columns if c.avro in ("long", "int")]
    if time_field is not None:
        chosen = [c for c in candidates if c.name == time_field]
        if not chosen:
            reason = "no integer column of that name (it must be a flattened column name)"
            raise UnsupportedSchema(source, time_field, reason)
        unit = _unit(chosen[0])
        if unit is None:
            reason = "give it a timestamp-nanos/micros/millis logicalType or a *Nanos name"
            raise UnsupportedSchema(source, time_field, reason)
        return TimeColumn(chosen[0].name, unit)
    for column in sorted(candidates, key=lambda c: c.logical is None):
        unit = _unit(column)
        if unit is not None:
            return TimeColumn(column.name, unit)
    return None


def _unit(column: Column) -> int | None:
    if column.logical in _TIME_UNITS:
        return _TIME_UNITS[column.logical]
    lowered = column.name.lower()
    for suffix, unit in _TIME_SUFFIXES:
        if lowered.endswith(suffix) and "time" in lowered:
            return unit
    return None
