"""The export job: a stream flattened through an Avro schema into Parquet, CSV, JSON lines.

    summary = export(spark, ExportSpec("examples/network", "NetworkSamples", Path("out"),
                                       store="embedded:/edge"), RunOptions())

Each batch publishes files hive-partitioned by event time, with lineage columns `_segment`,
`_offset`, `_sample`; malformed events go to `_quarantine` with their reason. Delivery:
**exactly-once** files (staged, recorded in the ledger, published by atomic rename), so DuckDB
sees every sample once or not yet. More: `DESIGN.md`, "export"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.jobs.checkpoint import Checkpoint, JobIdentity, default_checkpoint
from pipeline.jobs.runner import (
    SERVICE,
    BatchReport,
    JobSource,
    JobSummary,
    RunOptions,
    run_query,
    sluice_run,
)
from pipeline.schemas import flatten_plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

DEFAULT_FORMATS = ("parquet", "csv")
MAX_ROWS_PER_FILE = 1_000_000


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


def export(
    spark: SparkSession,
    spec: ExportSpec,
    run: RunOptions,
    report: Callable[[BatchReport], None] = lambda _: None,
) -> JobSummary:
    """Run the export until caught up (`available-now`) or until stopped (`continuous`)."""
    plan = flatten_plan(spec.schema, spec.time_field)  # a bad schema fails here, before Spark
    output = spec.output.absolute()
    identity = JobIdentity("export", f"{spec.store}#{spec.stream}", str(output))
    root = run.checkpoint or default_checkpoint("export", spec.stream, str(output))

    def sink(events: DataFrame, checkpoint: Checkpoint) -> DataStreamWriter:
        writer = (
            events.writeStream.format("sluice-export")
            .option("schema", plan.schema.source)
            .option("output", str(output))
            .option("formats", ",".join(spec.formats))
            .option("maxRowsPerFile", str(spec.max_rows_per_file))
            .option("state", str(checkpoint.ledger_path))
            .queryName(f"export {spec.stream} -> {output}")
        )
        if spec.time_field is not None:
            writer = writer.option("timeField", spec.time_field)
        return writer

    with Checkpoint(root, identity) as checkpoint:
        # Range rows: each task reads its range from the store and flattens it itself.
        source = JobSource(spec.store, spec.stream, emit="ranges")
        batches = run_query(spark, checkpoint, source, run=run, sink=sink, report=report)
        outputs = {
            "output": str(output),
            "formats": list(spec.formats),
            "schema": plan.name,
            "columns": plan.describe(),
        }
        return JobSummary("export", str(checkpoint.root), batches, outputs)
