"""Sluice's jobs: plain functions over a SparkSession (mirror, export, console, bookmark,
replay, the streaming join), each with a spec and, for a streaming job, its command line
(`DESIGN.md`)."""
