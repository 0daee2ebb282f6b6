"""Spark for Sluice: the session builder and the `sluice` / `sluice-export` data sources.

    spark = spark_session()   # one per process; sources registered
    spark.read.format("sluice").option("stream", "examples/network").load()

`session.py` builds the session; `source.py` registers the data sources, whose readers are in
`reading.py`, the exactly-once stream sink in `writing.py`, the export's file sink in
`export_sink.py` (driver) with `export_writer.py` (tasks) and `export_layout.py` (the files),
and the batch ledger both sinks commit through in `ledger.py`. pyspark is imported only when
a session or a data source is asked for.
"""

from __future__ import annotations

from pipeline.spark.session import SparkSettings, spark_conf, spark_session

__all__ = ["SparkSettings", "spark_conf", "spark_session"]
