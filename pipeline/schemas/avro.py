"""Avro schemas: the bundled `.avsc` files and loading any other, parsed with fastavro.

A schema is named either by a path to an `.avsc` file or by the name of a bundled one
(`NetworkSamples`, `AccelerometerSamples`, `GeneratorSamples`). fastavro checks the schema
(names, defaults, unions) and expands it to its canonical parsed form; `AvroSchema` keeps the
original text too, so a plan can be rebuilt from it in another process (an executor).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import fastavro.schema

from pipeline.schemas.errors import InvalidSchema, SchemaNotFound

BUNDLED_DIR = Path(__file__).with_name("avsc")


@dataclass(frozen=True, slots=True)
class AvroSchema:
    """One parsed Avro record schema.

    `fingerprint` is the SHA-256 of the schema's Parsing Canonical Form: two files that define
    the same schema (whitespace, docs and order of attributes aside) have the same fingerprint.
    """

    source: str
    text: str
    parsed: dict
    fingerprint: str

    @property
    def full_name(self) -> str:
        return str(self.parsed.get("name", ""))

    @property
    def name(self) -> str:
        return self.full_name.rsplit(".", 1)[-1]


def bundled_schemas() -> tuple[str, ...]:
    """Names of the schemas shipped with Sluice."""
    return tuple(sorted(p.stem for p in BUNDLED_DIR.glob("*.avsc")))


def schema_path(name_or_path: str | Path) -> Path:
    """The `.avsc` file a schema name or path stands for."""
    path = Path(name_or_path)
    if path.suffix == ".avsc" and path.is_file():
        return path.absolute()
    bundled = BUNDLED_DIR / f"{path.stem if path.suffix == '.avsc' else name_or_path}.avsc"
    if bundled.is_file():
        return bundled
    raise SchemaNotFound(str(name_or_path), bundled_schemas())


def load_schema(name_or_path: str | Path) -> AvroSchema:
    """Load and check the schema named by a bundled name or an `.avsc` path."""
    path = schema_path(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSchema(str(path), f"cannot be read: {exc}") from None
    return parse_schema_text(text, str(path))


def parse_schema_text(text: str, source: str = "<text>") -> AvroSchema:
    """Parse the JSON text of an Avro schema; the top level must be a record."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSchema(source, f"not JSON: {exc}") from None
    try:
        parsed = fastavro.schema.parse_schema(raw, _write_hint=False)
        canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    except Exception as exc:  # fastavro raises several unrelated types for bad schemas
        raise InvalidSchema(source, str(exc)) from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise InvalidSchema(source, "the top-level type must be a record (one event)")
    fingerprint = hashlib.sha256(canonical.encode()).hexdigest()
    return AvroSchema(source=source, text=text, parsed=parsed, fingerprint=fingerprint)
