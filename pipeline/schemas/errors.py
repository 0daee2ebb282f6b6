"""Typed errors of schema loading and flatten planning (bad events are quarantined, not raised)."""

from __future__ import annotations

from pipeline.errors import SluiceError


class SchemaError(SluiceError):
    """Base class of the errors `pipeline.schemas` raises on purpose."""


class SchemaNotFound(SchemaError, LookupError):
    def __init__(self, name: str, bundled: tuple[str, ...]) -> None:
        self.name, self.bundled = name, bundled
        msg = (
            f"schema {name!r} is neither an .avsc file nor a bundled schema: give a path to an "
            f".avsc file or one of {', '.join(bundled)}"
        )
        super().__init__(msg)


class InvalidSchema(SchemaError, ValueError):
    """The .avsc file is not a valid Avro schema (as judged by fastavro)."""

    def __init__(self, source: str, reason: str) -> None:
        self.source, self.reason = source, reason
        msg = f"invalid Avro schema {source}: {reason}"
        super().__init__(msg)


class UnsupportedSchema(SchemaError, ValueError):
    """A valid Avro schema that cannot be flattened into one table."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source, self.field, self.reason = source, field, reason
        msg = f"schema {source}: field {field!r} cannot be flattened: {reason}"
        super().__init__(msg)
