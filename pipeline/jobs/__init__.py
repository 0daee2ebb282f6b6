"""Sluice's jobs: plain functions over a SparkSession (mirror, export, console, bookmark,
replay, join)."""
