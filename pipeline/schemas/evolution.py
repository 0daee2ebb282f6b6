"""Whether the events written under one Avro schema still flatten through another.

An export's schema may change between two of its runs (`pipeline/jobs/export.py` checks each
run's schema against the one its earlier runs used). Avro's schema resolution decides, read
the way the flatten reads JSON events, by field name:

- a field removed, a field added with a default, a number widened (int → long, float,
  double; long → float, double; float → double), a field made optional, an enum given more
  symbols, a change of docs, order or whitespace: compatible, the export goes on;
- a field added without a default, a type Avro does not promote, a field made required, an
  enum symbol removed (without an enum default): every event written before the change
  would be quarantined, so the change is refused, naming the field;
- a field renamed through an alias: refused too. Events are JSON objects read by field
  name, so the events that carry the old name would be quarantined (or silently take the
  new field's default), and the Parquet files would hold the field under two column names.

The rules: `DESIGN.md`, "Schema evolution"."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fastavro.schema

from pipeline.schemas.avro import AvroSchema

#: Avro's promotions of numbers (writer type, reader type); the Parquet files widen alike.
PROMOTIONS = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
    }
)


@dataclass(frozen=True, slots=True)
class Incompatible:
    """One change that events written under the old schema would not survive: the field
    (its flattened name, `parent_child`) and why."""

    field: str
    reason: str


def incompatibilities(old: AvroSchema, new: AvroSchema) -> list[Incompatible]:
    """Every change from `old` to `new` that events written under `old` would not survive
    (module doc); empty when `new` reads them all (two texts of one schema: always)."""
    if old.fingerprint == new.fingerprint:
        return []
    before = fastavro.schema.expand_schema(old.parsed)
    after = fastavro.schema.expand_schema(new.parsed)
    return list(_record(before, after, ()))


def _record(old: dict, new: dict, prefix: tuple[str, ...]) -> Iterator[Incompatible]:
    written = {f["name"]: f for f in old["fields"]}
    for field in new["fields"]:
        name = field["name"]
        where = "_".join((*prefix, name))
        if name in written:
            yield from _type(written[name]["type"], field["type"], (*prefix, name))
            continue
        renamed = next((a for a in field.get("aliases", ()) if a in written), None)
        if renamed is not None:
            reason = (
                f"renames field {renamed!r} (an alias): events are read by field name, so "
                f"those that carry {renamed!r} would be quarantined or take the default, and "
                "the files would hold the field under two column names"
            )
            yield Incompatible(where, reason)
        elif "default" not in field:
            reason = (
                "is new and has no default: the events written before it lack it and would be "
                'quarantined; give it a default (or make it optional, ["null", …] with '
                "default null)"
            )
            yield Incompatible(where, reason)


def _type(old: Any, new: Any, path: tuple[str, ...]) -> Iterator[Incompatible]:
    where = "_".join(path)
    old_optional, old = _optional(old)
    new_optional, new = _optional(new)
    if old_optional and not new_optional:
        reason = "was optional and is now required: events that hold null would be quarantined"
        yield Incompatible(where, reason)
    was, now = _kind(old), _kind(new)
    if was != now:
        if (was, now) not in PROMOTIONS:
            reason = (
                f"changes type from {was} to {now}, which Avro does not promote: the events "
                "written before would be quarantined"
            )
            yield Incompatible(where, reason)
        return
    if was == "record":
        yield from _record(old, new, path)
    elif was == "array":
        yield from _type(old["items"], new["items"], path)
    elif was == "map":
        yield from _type(old["values"], new["values"], path)
    elif was == "enum":
        gone = [s for s in old["symbols"] if s not in new["symbols"]]
        if gone and "default" not in new:
            dropped = ", ".join(gone)
            reason = (
                f"no longer has the symbols {dropped}: events that hold them would be quarantined"
            )
            yield Incompatible(where, reason)
    elif was == "fixed" and old["size"] != new["size"]:
        reason = f"changes size from {old['size']} to {new['size']} bytes"
        yield Incompatible(where, reason)


def _optional(avro: Any) -> tuple[bool, Any]:
    """Whether `avro` allows null, and its one other type (a union of several is kept)."""
    if not isinstance(avro, list):
        return False, avro
    rest = [b for b in avro if _kind(b) != "null"]
    return len(rest) < len(avro), rest[0] if len(rest) == 1 else rest


def _kind(avro: Any) -> str:
    if isinstance(avro, list):
        return "union"
    return avro if isinstance(avro, str) else str(avro.get("type"))
