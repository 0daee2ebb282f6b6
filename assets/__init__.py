"""Sluice's Dagster definitions: one asset family per stream of sluice.toml (`assets/DESIGN.md`)."""
