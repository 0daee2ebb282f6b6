"""Dagster resources: thin, lazy `ConfigurableResource`s over the stores, Spark and DuckDB."""

from __future__ import annotations

from resources.analytics import AnalyticsResource
from resources.spark import SparkResource
from resources.stores import StreamStoresResource, UnknownStore

__all__ = ["AnalyticsResource", "SparkResource", "StreamStoresResource", "UnknownStore"]
