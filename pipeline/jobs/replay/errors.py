"""The errors a replay raises on purpose: each names what to do next."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SluiceError


class ReplayError(SluiceError):
    """Base of the errors a replay raises on purpose."""


class SliceTruncated(ReplayError):
    def __init__(self, slice_id: str, stream: str, segment: int, start: int, head: int) -> None:
        self.slice_id, self.stream, self.segment = slice_id, stream, segment
        self.start, self.head = start, head
        msg = (
            f"slice {slice_id} cannot be replayed: {stream} segment {segment} was truncated at "
            f"offset {head}, past the slice's start {start}; its first events are gone. "
            "Replay a newer slice, or keep history longer (stream retention)"
        )
        super().__init__(msg)


class ModelError(ReplayError):
    """A model that cannot be loaded or run, or whose results cannot be kept; `trace` is the
    traceback of the model's own code (Sluice's frames left out) when its code raised."""

    def __init__(self, model: str, reason: str, trace: str = "") -> None:
        self.model, self.reason, self.trace = model, reason, trace
        msg = f"model {model}: {reason}" + (f"\n{trace}" if trace else "")
        super().__init__(msg)


class OutputInUse(ReplayError):
    """`--output` names a directory that holds another replay's files."""

    def __init__(self, output_dir: Path, theirs: str, ours: str) -> None:
        self.output_dir, self.theirs, self.ours = output_dir, theirs, ours
        msg = (
            f"{output_dir} holds the files of replay {theirs}, not of this one ({ours}): a "
            "replay never overwrites another's results; choose another --output, or leave it "
            "out (each replay then gets its own directory under $SLUICE_HOME/replays)"
        )
        super().__init__(msg)


class BadLineageRecord(ReplayError, ValueError):
    """A lineage file this Sluice cannot read (another version, or not a lineage record)."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path, self.reason = str(path), reason
        msg = f"lineage record {path}: {reason} (was it written by a newer Sluice?)"
        super().__init__(msg)


class UnknownSchema(ReplayError):
    def __init__(self, stream: str) -> None:
        self.stream = stream
        msg = (
            f"no Avro schema is known for {stream}: pass --schema NAME (or a .avsc path), "
            "or add it to sluice.toml as [streams.NAME] stream/schema"
        )
        super().__init__(msg)


class SliceSensorUnknown(ReplayError):
    """A slice that names its sensor by columns the rows of the schema it is replayed with
    do not have (`--sensor-by` of `sluice slices create` is checked only when sluice.toml
    names the stream's schema)."""

    def __init__(
        self, slice_id: str, sensor_by: str, missing: list[str], schema: str, columns: list[str]
    ) -> None:
        self.slice_id, self.sensor_by, self.missing = slice_id, sensor_by, missing
        self.schema, self.columns = schema, columns
        said = ", ".join(repr(c) for c in missing)
        msg = (
            f"slice {slice_id} names its sensor by {sensor_by!r}, but the rows of {schema} have "
            f"no column {said} (their columns: {', '.join(columns)}): record the slice again "
            "with --sensor-by naming columns of the schema (or routing_key), or replay it "
            "with the --schema it was made for"
        )
        super().__init__(msg)
