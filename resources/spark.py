"""Spark as a Dagster resource: lazy, one session per process (`LazyPySparkResource`'s idea).

Its fields are `SparkSettings`'s, filled by `assets/definitions.py` from `[spark]` of
sluice.toml and `SLUICE_SPARK_*` (`from_settings`), so the UI shows how runs build Spark.
The session is built only when a step asks for it, through `pipeline.spark.session` (attached
to the warm Spark of `sluice spark start` when one runs), with the `sluice` data sources
registered; every step of a run in one process shares it, and the
resource never stops it (the next step would pay for a JVM start-up again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg
from pydantic import PrivateAttr

from pipeline.spark.session import SparkSettings, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(dg.ConfigurableResource):
    """A lazily created Spark session; `local[*]` on loopback unless configured."""

    master: str = "local[*]"
    app_name: str = "sluice-dagster"
    driver_host: str = "127.0.0.1"
    log_level: str = "ERROR"
    ui: bool = False
    conf: dict[str, str] = {}
    #: `auto` (attach to the server `sluice spark start` runs, else local), `local`, `sc://…`
    remote: str = "auto"
    #: map the archive of Spark's classes (built in the background when missing)
    class_archive: bool = True
    #: restart `sluice spark start`'s server past this many Python daemons (none attached)
    server_max_daemons: int = 40

    _session: SparkSession | None = PrivateAttr(default=None)

    @classmethod
    def from_settings(cls, settings: SparkSettings) -> SparkResource:
        """The resource for `settings` (their `app_name` aside: Dagster's runs keep theirs)."""
        return cls(
            master=settings.master,
            driver_host=settings.driver_host,
            log_level=settings.log_level,
            ui=settings.ui,
            conf=dict(settings.conf),
            remote=settings.remote,
            class_archive=settings.class_archive,
            server_max_daemons=settings.server_max_daemons,
        )

    def settings(self) -> SparkSettings:
        return SparkSettings(
            master=self.master,
            app_name=self.app_name,
            driver_host=self.driver_host,
            log_level=self.log_level,
            ui=self.ui,
            conf=tuple(sorted(self.conf.items())),
            remote=self.remote,
            class_archive=self.class_archive,
            server_max_daemons=self.server_max_daemons,
        )

    @property
    def session(self) -> SparkSession:
        """The process's session, created on first use."""
        if self._session is None:
            self._session = spark_session(self.settings())
        return self._session
