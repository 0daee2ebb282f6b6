"""The export job: a stream flattened through an Avro schema into Parquet, CSV, JSON lines.

    summary = export(spark, ExportSpec("examples/network", "NetworkSamples", Path("out"),
                                       store="embedded:/edge"), RunOptions())

Each batch publishes files hive-partitioned by event time, with lineage columns `_segment`,
`_offset`, `_sample`; malformed events go to `_quarantine` with their reason. Delivery:
**exactly-once** files (staged, recorded in the ledger, published by atomic rename), so DuckDB
sees every sample once or not yet. Every run records where it writes (`ExportRecord`, under
`$SLUICE_HOME/registry/exports/`), so the analytics database finds each export wherever its
files are. More: `DESIGN.md`, "export"."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import durable
from pipeline.config import sluice_home
from pipeline.errors import SluiceError
from pipeline.jobs import output_claim
from pipeline.jobs.checkpoint import (
    Checkpoint,
    JobIdentity,
    JobParameters,
    default_checkpoint,
    ledger_totals,
)
from pipeline.jobs.in_process import stream_writer_batch
from pipeline.jobs.runner import (
    SERVICE,
    BatchReport,
    JobSource,
    JobSummary,
    RunOptions,
    run_query,
    sluice_run,
)
from pipeline.outputs import check_writable
from pipeline.schemas import FlattenPlan, flatten_plan, parse_schema_text
from pipeline.schemas.evolution import incompatibilities

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from pipeline.jobs.runner import SessionFactory

DEFAULT_FORMATS = ("parquet", "csv")
MAX_ROWS_PER_FILE = 1_000_000
EXPORT_RECORD_VERSION = 1
#: The text of the schema an export's last run flattened through, in its checkpoint
SCHEMA_FILE = "schema.avsc"


@dataclass(frozen=True, slots=True)
class ExportSpec:
    """What to export, through which schema, where and how."""

    stream: str
    schema: str
    output: Path
    store: str
    formats: tuple[str, ...] = DEFAULT_FORMATS
    max_rows_per_file: int = MAX_ROWS_PER_FILE
    time_field: str | None = None

    def command_line(self, run: RunOptions = SERVICE) -> list[str]:
        """The `sluice run export …` argv that runs exactly this spec."""
        flags = ["--stream", self.stream, "--schema", self.schema, "--output", str(self.output)]
        flags += ["--format", ",".join(self.formats)]
        if self.max_rows_per_file != MAX_ROWS_PER_FILE:
            flags += ["--max-rows-per-file", str(self.max_rows_per_file)]
        if self.time_field is not None:
            flags += ["--time-field", self.time_field]
        return sluice_run(self.store, "export", flags, run)


class BadExportRecord(SluiceError, ValueError):
    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = str(path), reason
        msg = f"export record {path}: {reason} (remove it; the export's next run writes it again)"
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class ExportRecord:
    """Where an export writes: its stream (in `store`), schema, time field and the absolute
    output directory. Every run writes it (the same bytes when nothing changed) to
    `$SLUICE_HOME/registry/exports/<stream>--<hash of output>.json`, before its first batch,
    so the analytics database knows the directory even of an export still running."""

    stream: str
    schema: str
    output: str
    store: str
    formats: tuple[str, ...]
    time_field: str | None = None
    version: int = EXPORT_RECORD_VERSION

    @classmethod
    def of(cls, spec: ExportSpec) -> ExportRecord:
        return cls(
            spec.stream,
            spec.schema,
            str(spec.output.absolute()),
            spec.store,
            tuple(spec.formats),
            spec.time_field,
        )

    @classmethod
    def read(cls, path: Path) -> ExportRecord:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BadExportRecord(path, f"not readable JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != EXPORT_RECORD_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            reason = f"version {version!r}; this Sluice reads {EXPORT_RECORD_VERSION}"
            raise BadExportRecord(path, reason)
        names = {f.name for f in fields(cls)}
        if missing := sorted(names - data.keys()):
            raise BadExportRecord(path, f"missing {', '.join(missing)}")
        return cls(**{**{k: data[k] for k in names}, "formats": tuple(data["formats"])})


class SchemaChanged(SluiceError, ValueError):
    """The schema gives a column another type than the output's earlier files have."""

    def __init__(self, output: Path, column: str, was: str, now: str, schema: str) -> None:
        self.output, self.column, self.was, self.now = str(output), column, was, now
        msg = (
            f"export to {output}: schema {schema} makes column {column!r} {now}, but the "
            f"files already there hold it as {was}; a query over both would fail. Export to "
            "a new output directory, or give the changed field a new name"
        )
        super().__init__(msg)


class SchemaIncompatible(SluiceError, ValueError):
    """A schema that the events written under the schema of the export's earlier runs would
    not fit (`pipeline.schemas.evolution`): they would be quarantined, or split a column."""

    def __init__(self, output: Path, schema: str, kept: Path, field: str, reason: str) -> None:
        self.output, self.schema, self.kept = str(output), schema, str(kept)
        self.field, self.reason = field, reason
        msg = (
            f"export to {output}: schema {schema} does not fit the events of the schema its "
            f"earlier runs used ({kept}): field {field!r} {reason}. Change the schema so that "
            "it does, or export to a new --output with a new --checkpoint"
        )
        super().__init__(msg)


def check_schema_evolution(plan: FlattenPlan, output: Path, checkpoint: Path) -> None:
    """Refuse (`SchemaIncompatible`) a schema that the events written under the one the
    checkpoint's last run used would not fit, by Avro's resolution rules: a field added
    without a default, a type Avro does not promote, a field renamed through an alias. The
    same schema in other words (whitespace, docs, order of attributes) goes on, as does a
    checkpoint that kept no schema (made before this check)."""
    kept = checkpoint / SCHEMA_FILE
    if not kept.is_file():
        return
    old = parse_schema_text(kept.read_text(encoding="utf-8"), str(kept))
    for change in incompatibilities(old, plan.schema):
        raise SchemaIncompatible(output, plan.schema.source, kept, change.field, change.reason)


def keep_schema(plan: FlattenPlan, checkpoint: Path) -> None:
    """Keep the run's schema text in its checkpoint, for the next run's check."""
    kept = checkpoint / SCHEMA_FILE
    if not kept.is_file() or kept.read_text(encoding="utf-8") != plan.schema.text:
        durable.write_text(kept, plan.schema.text)


#: Type changes a reader of the Parquet files (DuckDB's `union_by_name`) widens without
#: loss: Avro's promotions of numbers. Any other change of a column's type is refused.
_WIDENS = {
    ("int32", "int64"),
    ("int32", "float"),
    ("int32", "double"),
    ("int64", "float"),
    ("int64", "double"),
    ("float", "double"),
}


def check_schema_fits(plan: FlattenPlan, output: Path) -> None:
    """Refuse (`SchemaChanged`) a plan that gives a column of the output's published Parquet
    files another type, unless it only widens a number: a new or a removed field is fine,
    the views read all the files by column name.

    Every run is checked this way, so the types a column has had in the output are a chain
    of widenings, and the newest file that holds a column holds its widest type: the files
    are read newest first, until every planned column is found (one file, usually; all of
    them only on the first run after a field is added)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    planned = {f.name: str(f.type) for f in plan.arrow_schema}
    files = sorted(output.glob("parquet/date=*/hour=*/*.parquet"), key=_written, reverse=True)
    for path in files:
        if not planned:
            return
        for field in pq.read_schema(path):
            if (now := planned.pop(field.name, None)) is None:
                continue
            kind = field.type
            was = str(kind.value_type if pa.types.is_dictionary(kind) else kind)
            if was != now and (was, now) not in _WIDENS:
                raise SchemaChanged(output, field.name, was, now, plan.schema.source)


class OutputGone(SluiceError, LookupError):
    """Every file an export's checkpoint published in one format is gone from its output
    directory (deleted, or the directory moved): the checkpoint would go on from where it
    stands and never write them again, so the views and checks would stay short for good."""

    def __init__(self, output: Path, checkpoint: Path, fmt: str, published: int) -> None:
        self.output, self.checkpoint, self.format, self.published = (
            output,
            checkpoint,
            fmt,
            published,
        )
        msg = (
            f"export to {output}: none of the {published} {fmt} files its checkpoint "
            f"{checkpoint} published is there any more (deleted, or the directory moved): "
            f"move them back, or, to export the stream again from its start, delete {output} "
            "and that checkpoint"
        )
        super().__init__(msg)


def check_output_kept(output: Path, checkpoint: Path, formats: Sequence[str]) -> None:
    """Refuse (`OutputGone`) to go on when none of a format's published files is left in
    the output. Some of them gone is an operator's retention (old partitions removed), and
    the export goes on; all of them gone is a moved or deleted output."""
    published = ledger_totals(checkpoint).files
    for fmt in formats:
        mine = [f for f in published if f.split("/", 1)[0] == fmt]
        if mine and not any((output / f).exists() for f in mine):
            raise OutputGone(output, checkpoint, fmt, len(mine))


class OutputTaken(SluiceError, ValueError):
    """The output directory holds files an export published with another checkpoint, and this
    run's checkpoint has published nothing: its batches would publish the same names again."""

    def __init__(self, output: Path, checkpoint: Path, found: Path, others: list[str]) -> None:
        self.output, self.checkpoint, self.found, self.others = output, checkpoint, found, others
        named = f" (recorded: {'; '.join(others)})" if others else ""
        msg = (
            f"export to {output}: it holds files an export published with another "
            f"checkpoint{named}, such as {found}, and this run's checkpoint {checkpoint} has "
            "published none: its batches would publish files of the same names again, and rows "
            "would be replaced or counted twice. Go on with that export (its --output and "
            "--checkpoint), or export to a new directory"
        )
        super().__init__(msg)


def check_output_free(spec: ExportSpec, output: Path, checkpoint: Path) -> None:
    """Refuse (`OutputTaken`) a checkpoint that has published nothing yet into an output that
    already holds published files: those of another stream, of a checkpoint since deleted, or
    of this directory under another name (a symbolic link to it, a path through `..`), whose
    checkpoint is another. File names number the batches of one checkpoint
    (`part-b<batch>-t<task>-f<n>`), so one output directory has one checkpoint."""
    from pipeline.spark.export_layout import EXTENSIONS, QUARANTINE
    from pipeline.spark.ledger import BatchLedger

    ledger = checkpoint / "ledger.sqlite"
    if ledger.exists():
        with BatchLedger(ledger) as opened:
            if opened.batches():
                return  # it published there: `check_output_kept` looks at its files
    here = output.resolve()  # `other/../out` before `other` exists: its files are out's
    patterns = [f"{kind}/date=*/hour=*/part-*" for kind in EXTENSIONS] + [f"{QUARANTINE}/part-*"]
    found = next((f for pattern in patterns for f in here.glob(pattern)), None)
    if found is None:
        return
    others = [
        f"{r.stream} to {r.output}"
        for r in registered_exports()
        if Path(r.output).resolve() == here
        and (r.stream, r.store, r.output) != (spec.stream, spec.store, str(output))
    ]
    raise OutputTaken(output, checkpoint, found, others)


def _written(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def export_registry(home: Path | None = None) -> Path:
    return (home or sluice_home()) / "registry" / "exports"


def record_export(spec: ExportSpec, home: Path | None = None) -> Path:
    """Write (or leave as it is, when unchanged) the spec's `ExportRecord`; return its path."""
    record = ExportRecord.of(spec)
    digest = hashlib.sha256(record.output.encode()).hexdigest()[:12]
    name = f"{record.stream.replace('/', '.')}--{digest}.json"
    path = export_registry(home) / name
    text = json.dumps(asdict(record), indent=2, sort_keys=True) + "\n"
    if not path.exists() or path.read_text() != text:
        durable.write_text(path, text)
    return path


def registered_exports(home: Path | None = None) -> list[ExportRecord]:
    """Every recorded export, in name order."""
    registry = export_registry(home)
    return [ExportRecord.read(path) for path in sorted(registry.glob("*.json"))]


def export_identity(spec: ExportSpec) -> JobIdentity:
    """What the export's checkpoint records (`job.json`): the stream, with its store, and the
    output directory (absolute)."""
    return JobIdentity("export", f"{spec.store}#{spec.stream}", str(spec.output.absolute()))


def export_checkpoint(spec: ExportSpec) -> Path:
    """The checkpoint `sluice run export` uses without `--checkpoint` (and the assets)."""
    return default_checkpoint(export_identity(spec), spec.stream, str(spec.output.absolute()))


def export_parameters(spec: ExportSpec, plan: FlattenPlan) -> JobParameters:
    """What an export's files were made with beyond its stream and output: the formats and
    the event-time column that partitions the rows (the one `--time-field` names, else the
    schema's). The schema may change (`check_schema_fits`, `check_schema_evolution`), and
    `max_rows_per_file` only sizes files."""
    formats = ",".join(sorted(set(spec.formats)))
    time = () if plan.time is None else (f"--time-field {plan.time.name}",)
    return JobParameters("export", (f"--format {formats}", *time))


#: Why an export's checkpoint refuses other formats or another time field
EXPORT_CHANGED = (
    "a format added would hold only the rows from here on, one dropped would stay behind as "
    "it is, and rows partitioned by another time field would sit beside those already there"
)
#: How to export with other ones
EXPORT_REMEDY = "export to a new --output with a new --checkpoint to use the new ones"


def export(
    spark: SparkSession | SessionFactory,
    spec: ExportSpec,
    run: RunOptions,
    report: Callable[[BatchReport], None] = lambda _: None,
) -> JobSummary:
    """Run the export until caught up (`available-now`) or until stopped (`continuous`).
    An output directory that cannot be written is refused before anything else (Spark, the
    checkpoint, the export's record); a disk that fills while it runs stops it with
    `OutputNotWritable` naming the directory, and the next run finishes the batch. A new
    checkpoint into a directory that holds another checkpoint's files is refused
    (`OutputTaken`): one output directory, whatever its name, has one checkpoint."""
    plan = flatten_plan(spec.schema, spec.time_field)  # a bad schema fails here, before Spark
    output = spec.output.absolute()
    check_writable(output)
    check_schema_fits(plan, output)
    identity = export_identity(spec)
    root = run.checkpoint or export_checkpoint(spec)

    def options(checkpoint: Checkpoint) -> dict[str, str]:
        opts = {
            # the text, not the file: the tasks flatten through the schema this run checked
            "schema": plan.schema.text,
            "output": str(output),
            "formats": ",".join(spec.formats),
            "maxRowsPerFile": str(spec.max_rows_per_file),
            "state": str(checkpoint.ledger_path),
        }
        if spec.time_field is not None:
            opts["timeField"] = spec.time_field
        return opts

    def sink(events: DataFrame, checkpoint: Checkpoint) -> DataStreamWriter:
        return (
            events.writeStream.format("sluice-export")
            .options(**options(checkpoint))
            .queryName(f"export {spec.stream} -> {output}")
        )

    with Checkpoint(root, identity) as checkpoint:
        wanted = export_parameters(spec, plan)
        has_output = not checkpoint.is_new
        checkpoint.check_parameters(
            wanted, has_output=has_output, why=EXPORT_CHANGED, remedy=EXPORT_REMEDY
        )
        if has_output:
            check_schema_evolution(plan, output, checkpoint.root)
        checkpoint.note_start(run.starting)
        check_output_kept(output, checkpoint.root, spec.formats)
        check_output_free(spec, output, checkpoint.root)
        output_claim.claim("export", output, checkpoint.root)
        keep_schema(plan, checkpoint.root)
        record_export(spec)
        # Range rows: each task reads its range from the store and flattens it itself.
        source = JobSource(spec.store, spec.stream, emit="ranges")
        small = stream_writer_batch("sluice-export", options(checkpoint))
        batches = run_query(
            spark, checkpoint, source, run=run, sink=sink, report=report, in_process=small
        )
        outputs = {
            "output": str(output),
            "formats": list(spec.formats),
            "schema": plan.name,
            "columns": plan.describe(),
        }
        return JobSummary("export", str(checkpoint.root), batches, outputs)
