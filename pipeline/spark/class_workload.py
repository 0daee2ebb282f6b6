"""The Spark job whose classes go into the class archive (`class_archive.py`): run by
`spark-submit` with `-XX:ArchiveClassesAtExit`, it loads what Sluice's jobs load in a driver
(SQL planning and codegen, Arrow transfer, the `sluice` Python data source, batch and
streaming reads, `foreachBatch`).

    spark-submit pipeline/spark/class_workload.py WORK_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(work: Path) -> None:
    from pipeline.spark.session import SparkSettings, spark_session
    from pipeline.streams import open_store

    store = f"embedded:{work / 'store'}"
    with open_store(store) as opened:
        opened.create_stream("archive/events", segments=2)
        with opened.writer("archive/events") as writer:
            for i in range(20):
                event = {"TimestampNanos": [i, i + 1], "RxBytes": [i, i], "Interface": "eth0"}
                writer.write(json.dumps(event).encode(), routing_key=f"k{i % 2}")
    spark = spark_session(SparkSettings(master="local[2]", remote="local", class_archive=False))
    spark.range(1000).selectExpr("sum(id)", "max(id)").collect()
    spark.sql("SELECT 1 AS x, 'a' AS y").toArrow()
    read = spark.read.format("sluice").option("store", store).option("stream", "archive/events")
    read.load().groupBy("routing_key").count().toArrow()
    stream = (
        spark.readStream.format("sluice")
        .option("store", store)
        .option("stream", "archive/events")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(lambda batch, _: batch.toArrow())
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
