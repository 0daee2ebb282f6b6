"""What each view and column of the analytics database means: the text of its `COMMENT ON`.

An analyst reads them in plain DuckDB (`SELECT view_name, comment FROM duckdb_views()`,
`SELECT column_name, comment FROM duckdb_columns() WHERE table_name = 'rates'`). Columns of an
export view that come from the Avro schema take the field's `doc` when it has one."""

from __future__ import annotations

TIME = "the moment the row is about, a TIMESTAMPTZ in UTC (microseconds)"
POSITION = {
    "_segment": "stream position: the segment of the event the row was flattened from",
    "_offset": "stream position: the byte offset of that event in its segment",
    "_sample": "the row's index among the samples of its event (0 for the first)",
}
EXPORT = {
    "export": "the export's name (its [streams.NAME] family, or its stream and directory)",
    "kind": "the export's kind: the name of its Avro schema",
    "stream": "the stream the export flattened; _segment/_offset are positions in it",
    "time": f"the sample's event time, {TIME}",
    "date": "hive partition: the UTC date of the sample's event time",
    "hour": "hive partition: the UTC hour of the sample's event time",
    **POSITION,
}
RATES = {
    **EXPORT,
    "RemoteAddr": "host of the NIC collector",
    "Interface": "network interface (one NIC of one host)",
    "TimestampNanos": "sample time, nanoseconds since the Unix epoch (UTC)",
    "RxBytes": "received-bytes counter of the interface",
    "TxBytes": "transmitted-bytes counter of the interface",
    "interval_s": "seconds since the previous sample of the same NIC (NULL for its first)",
    "rx_mbps": "received Mbit/s since the previous sample of the same NIC; NULL for the first "
    "sample, a zero interval or a counter that went backwards",
    "tx_mbps": "transmitted Mbit/s since the previous sample of the same NIC (as rx_mbps)",
    "counter_reset": "true when a byte counter went backwards (reboot, wrap): no rate then",
}
QUARANTINE = {
    "export": EXPORT["export"],
    "time": f"when the event was written to the stream (its ingest time), {TIME}",
    "_stream": "the stream the event was read from",
    "_segment": "stream position: the event's segment",
    "_offset": "stream position: the event's byte offset in its segment",
    "_routing_key": "the event's routing key",
    "_ingest_time_ns": "the event's ingest time, nanoseconds since the Unix epoch",
    "schema": "the Avro schema the event did not conform to",
    "reason": "why the export refused the event",
    "payload": "the event's raw bytes, as written",
}
SLICES = {
    "slice_id": "the slice's id: a hash of what it is (stream, sensor, cuts, times, reason)",
    "stream": "the sliced stream",
    "sensor": "the sensor the slice is about (NULL: every sensor)",
    "sensor_by": "what names the sensor: routing_key, or columns joined with '/'",
    "time": f"the start of the slice's time of interest, {TIME}",
    "start_time": f"first moment of interest, {TIME}",
    "end_time": f"last moment of interest (inclusive), {TIME}",
    "start_time_ns": "start_time in nanoseconds since the Unix epoch (exact)",
    "end_time_ns": "end_time in nanoseconds since the Unix epoch (exact, inclusive)",
    "start_cut": "the stream cut the slice starts at (text form)",
    "end_cut": "the stream cut the slice ends at (text form)",
    "segments": "the cut range per segment: [start_offset, end_offset) bytes of each segment",
    "reason": "why the slice was recorded (the bookmark condition, or the time window)",
    "created_by": "who recorded it (sluice slices create, or a bookmark job)",
    "slices_stream": "the stream the slice record was read from",
    "version": "the version of the stored record",
}
SLICE_ROWS = {
    "slice_id": SLICES["slice_id"],
    "export": EXPORT["export"],
    "stream": EXPORT["stream"],
    "time": f"the row's sample time, {TIME}",
    **POSITION,
    "in_window": "true when the row's time is inside the slice's [start_time, end_time] (to "
    "the microsecond); a replay keeps those rows of the slice's sensor",
}
LINEAGE = {
    "run_id": "the replay's id: a hash of slice, model, code version and parameters",
    "slice_id": SLICES["slice_id"],
    "stream": SLICES["stream"],
    "sensor": SLICES["sensor"],
    "model": "the model, module:function",
    "model_version": "the model's code version (declared, or sha256 of its module source)",
    "params": "every parameter the model got, defaults included, as JSON",
    "params_hash": "sha256 of the canonical parameter text, in full",
    "time": f"when the replay started, {TIME}",
    "started_at": f"when the replay started, {TIME}",
    "finished_at": f"when the replay finished, {TIME}",
    "start_time": SLICES["start_time"],
    "end_time": SLICES["end_time"],
    "start_cut": SLICES["start_cut"],
    "end_cut": SLICES["end_cut"],
    "input_events": "events between the slice's cuts (of its routing key when it names one)",
    "input_rows": "flattened rows of the slice's sensor inside its times: the model's input",
    "quarantined_events": "events of the slice the schema refused",
    "output_rows": "rows the model returned",
    "output_dir": "the directory of results.parquet, metrics.json and lineage.json",
    "results_path": "the replay's results (Parquet)",
    "metrics_path": "the replay's metrics (JSON)",
    "results_current": "false for a record of an older Sluice whose results file was since "
    "overwritten by another replay (its rows are not in `replays`)",
    "version": "the version of the stored lineage record",
}
REPLAYS = {
    "run_id": LINEAGE["run_id"],
    "slice_id": SLICES["slice_id"],
    "model": LINEAGE["model"],
    "model_version": LINEAGE["model_version"],
    "params_hash": LINEAGE["params_hash"],
    "time": f"the model's own `time` column (or `second`, in older results), {TIME}",
}
SOURCES = {
    "kind": "what the views read there: export, quarantine, snapshot, rates or replays",
    "name": "the export, or the snapshot, it belongs to",
    "directory": "the directory, relative to the Sluice home (variable sluice_home) unless "
    "absolute",
    "location": "the directory as this session resolves it",
    "files": "files found there at the last refresh",
    "time": f"when the last refresh looked, {TIME}",
}

VIEWS = {
    "samples": "Every exported sample of every export, with the columns all kinds share: "
    "which export, its stream position and its time. The values are in the export's own view "
    "(or its kind's); join on (export, _segment, _offset, _sample).",
    "rates": "Per-sample rx/tx Mbit/s of every NIC export, since the previous sample of the "
    "same NIC (the Pravega Sensor Collector's NIC walkthrough columns); computed by the last "
    "refresh, once per exported file.",
    "quarantine": "Events the exports refused, with the reason and the raw payload.",
    "slices": "Every recorded slice (a pair of stream cuts), a snapshot taken by the last "
    "refresh from the slices streams of the stores in sluice.toml.",
    "slice_rows": "For each slice, exactly the exported rows between its cuts, by stream "
    "position: what a bounded read of the slice returns, flattened.",
    "lineage": "One row per replay: what it read (slice, cuts, counts), ran (model, version, "
    "parameters) and wrote (paths); a snapshot taken by the last refresh.",
    "replays": "Every current replay's result rows, tagged with the replay's identity; "
    "one row per result row.",
    "sources": "Where the views read files (export directories, snapshots, replay results) "
    "and how many were there at the last refresh: where Sluice looked.",
}
FIXED_COLUMNS = {
    "samples": EXPORT,
    "rates": RATES,
    "quarantine": QUARANTINE,
    "slices": SLICES,
    "slice_rows": SLICE_ROWS,
    "lineage": LINEAGE,
    "replays": REPLAYS,
    "sources": SOURCES,
}


def export_view(name: str, stream: str | None, root: str) -> str:
    return (
        f"The samples of export {name} ({stream or 'stream unknown'}), one row per sample, "
        f"from the Parquet files under {root}."
    )


def kind_view(kind: str, exports: list[str]) -> str:
    return f"Every exported {kind} sample, of the exports {', '.join(exports)}."


def quarantine_view(name: str) -> str:
    return f"Events export {name} refused, with the reason and the raw payload."


def data_column(kind: str | None, name: str, doc: str | None) -> str:
    source = f"the {kind} field {name}" if kind else f"exported column {name}"
    return f"{doc} ({source})" if doc else f"from {source}, one value per sample"


def result_column(name: str, models: list[str]) -> str:
    return f"a column of the results of {', '.join(models)}"
