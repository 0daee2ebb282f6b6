"""Spark as a Dagster resource: lazy, one session per process (`LazyPySparkResource`'s idea).

The session is built only when a step asks for it, through `pipeline.spark.session`, so it has
the `sluice` data sources registered, the running interpreter as `PYSPARK_PYTHON` and the
driver bound to loopback. `master` is `local[*]` by default (or `[spark] master` of
sluice.toml); any `spark://`, `k8s://` or `yarn` master by configuration. Spark allows one
session per process, so every step of a run in one process shares it, and it is never stopped
by the resource (stopping it would cost the next step a JVM start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg
from pydantic import PrivateAttr

from pipeline.spark.session import SparkSettings, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(dg.ConfigurableResource):
    """A lazily created Spark session; `master=None` keeps the sluice.toml / env settings."""

    master: str | None = None
    app_name: str = "sluice-dagster"
    driver_host: str = "127.0.0.1"
    conf: dict[str, str] = {}

    _session: SparkSession | None = PrivateAttr(default=None)

    def settings(self) -> SparkSettings:
        from pipeline.config import load_config

        base = SparkSettings.from_config(load_config())
        return SparkSettings(
            master=self.master or base.master,
            app_name=self.app_name,
            driver_host=self.driver_host,
            log_level=base.log_level,
            ui=base.ui,
            conf=tuple(sorted({**dict(base.conf), **self.conf}.items())),
        )

    @property
    def session(self) -> SparkSession:
        """The process's session, created on first use."""
        if self._session is None:
            self._session = spark_session(self.settings())
        return self._session
