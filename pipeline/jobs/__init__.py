"""Sluice's jobs: plain functions over a SparkSession (mirror, export, console, bookmark,
replay, the streaming join).

A new streaming job is a module here with a frozen spec, a run function that goes through
`runner.run_query` (and `runner.BatchStates` for per-batch state), and the spec's
`command_line()`; its `sluice run` parser goes in `pipeline/cli/run.py`.
"""
