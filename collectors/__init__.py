"""The edge collector: drivers sample sensors into a local SQLite buffer, and a sender moves it
into a stream with a two-phase commit: nothing lost, duplicated or reordered across crashes,
power cuts and store outages. `sluice collect [--config collector.toml]` runs it.

Layout: `settings.py` (with `options.py`, `psc_env.py`); `drivers/` (the contract `base.py`,
`registry.py`, one module per driver) and their helpers `batch.py`, `tabular.py`,
`nic_sampler.py`, `pacing.py`; `buffer/` (queue, ledger, status);
`coordinator.py` (PROTOCOL.md), `sender.py`, `instance.py`, `service.py`, `status.py` and
`metrics.py` (the same numbers for Prometheus). It imports `pipeline.streams` and the leaves
beneath it, nothing else of the platform: it runs with the `edge` extra only.
"""
