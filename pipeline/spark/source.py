"""The `sluice` and `sluice-export` Spark data sources (PySpark Python Data Source API, 4.2+).

    spark.readStream.format("sluice").option("stream", "examples/network").load()
    df.writeStream.format("sluice").option("stream", "cloud/network")
        .option("checkpointLocation", ck).start()

The options of each are listed in `DESIGN.md`, "Options"; the delivery guarantees are stated
in `reading.py`, `writing.py` and `export_sink.py`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource

from pipeline.spark.options import EXPORT, SOURCE, ExportOptions, SinkOptions, SourceOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from pipeline.spark.export_sink import ExportBatchWriter, ExportStreamWriter
    from pipeline.spark.reading import SluiceBatchReader, SluiceStreamReader
    from pipeline.spark.writing import SluiceBatchWriter, SluiceStreamWriter


class SluiceDataSource(DataSource):
    """Events of a stream (reads) and events into a stream (writes)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE

    def schema(self) -> str:
        from pipeline.spark.reading import EVENT_SCHEMA, RANGE_SCHEMA

        emit = str(self.options.get("emit", "events")).lower()
        return RANGE_SCHEMA if emit == "ranges" else EVENT_SCHEMA

    def reader(self, schema: StructType) -> SluiceBatchReader:
        from pipeline.spark.reading import SluiceBatchReader

        return SluiceBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> SluiceStreamReader:
        from pipeline.spark.reading import SluiceStreamReader

        return SluiceStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> SluiceBatchWriter:
        from pipeline.spark.writing import SluiceBatchWriter

        return SluiceBatchWriter(_sink(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> SluiceStreamWriter:
        from pipeline.spark.writing import SluiceStreamWriter

        return SluiceStreamWriter(_sink(self.options))


def _sink(options: dict) -> SinkOptions:
    """Parse sink options; create the target stream when `createSegments` asks for it, and
    resolve `commitMode=auto` by what the target store can do (`writing.py`)."""
    opts = SinkOptions.parse(options)
    if opts.create_segments is None and opts.commit_mode != "auto":
        return opts
    from pipeline.streams import open_store

    with open_store(opts.store) as store:
        if opts.create_segments is not None:
            store.create_stream(opts.stream, segments=opts.create_segments)
        if opts.commit_mode == "auto":
            mode = "tasks" if "txn_flush" in store.features else "driver"
            opts = replace(opts, commit_mode=mode)
    return opts


class SluiceExportDataSource(DataSource):
    """Flattened Parquet / CSV / JSON-lines files from `sluice` rows (write only)."""

    @classmethod
    def name(cls) -> str:
        return EXPORT

    def writer(self, schema: StructType, overwrite: bool) -> ExportBatchWriter:
        from pipeline.spark.export_sink import ExportBatchWriter

        return ExportBatchWriter(ExportOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> ExportStreamWriter:
        from pipeline.spark.export_sink import ExportStreamWriter

        return ExportStreamWriter(ExportOptions.parse(self.options))


#: The data sources by their format name, as `spark.read.format(…)` takes it.
DATA_SOURCES: dict[str, type[DataSource]] = {
    SOURCE: SluiceDataSource,
    EXPORT: SluiceExportDataSource,
}


def register_sources(spark: SparkSession) -> None:
    """Make `format("sluice")` and `format("sluice-export")` available in `spark`."""
    for source in DATA_SOURCES.values():
        spark.dataSource.register(source)
