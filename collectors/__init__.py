"""The edge collector: drivers sample sensors into a local SQLite buffer, and a sender moves
the buffer into a stream with a two-phase commit, so that no sample is lost, duplicated or
reordered across crashes, power cuts and store outages.

    sluice collect [--config collector.toml]     # run every configured instance
    sluice collect status                        # buffer depth, last committed sample, lag

Layout: `settings.py` (+ `options.py`, `psc_env.py`: collector.toml and the Pravega Sensor
Collector's environment variables), `buffer/` (the SQLite buffer: queue, transaction ledger, status,
schema), `coordinator.py` (the two-phase commit), `sender.py` (retries, backoff),
`instance.py` / `service.py` (threads, signals, draining), `status.py`, `drivers/` (nic,
accelerometer, files, mqtt, generator). Runs with the `edge` extra only: it imports
`pipeline.streams` and nothing else of the platform (no Spark, no Dagster, no JVM).
"""
