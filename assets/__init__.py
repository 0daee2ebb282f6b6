"""Sluice's Dagster definitions: one asset family per stream of sluice.toml (`assets/DESIGN.md`).

A new asset: its key, job and pool names in `keys.py`; a Spark step that catches up through
the factory in `catch_up.py` (`CatchUpStep`); wired per family in `family.py`, which
`definitions.py` loads.
"""
