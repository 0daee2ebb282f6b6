"""The Spark session: one per process, configured once, with the `sluice` sources registered.

`spark_session()` returns the process's session, creating it on first use. It attaches to a
warm Spark Connect server when one is named (`SLUICE_SPARK_REMOTE=sc://…`, `[spark] remote`)
or, by default, when `sluice spark start` left one running for this `$SLUICE_HOME`
(`pipeline/spark/connect.py`); otherwise it starts a local JVM: master `local[*]` unless
`SLUICE_SPARK_MASTER` (or `[spark] master` in sluice.toml) names another, `PYSPARK_PYTHON` the
running interpreter, the driver bound to loopback unless `SLUICE_SPARK_DRIVER_HOST` says
otherwise, Spark's logging at ERROR. Spark keeps one active session per process
(`getOrCreate`), so there is no module-level singleton: the settings of the first call win
(`DESIGN.md`, "The session" and "A warm Spark")."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pipeline.config import FileModes
from pipeline.errors import SluiceError
from pipeline.spark.errors import SparkLost, SparkUnreachable, without_token

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.spark.connect import ServerState

LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")
log = logging.getLogger(__name__)

#: A call to a Spark Connect server that does not answer is retried for about 10 s
#: (50 ms, x4 each time, at most 5 s apart), then fails.
RECONNECT_RETRIES, RECONNECT_MAX_BACKOFF_MS = 5, 5000

#: `remote` values: attach to this $SLUICE_HOME's server if one runs; never attach.
AUTO, LOCAL = "auto", "local"


class RemoteSettingError(SluiceError, ValueError):
    """`[spark] remote` (SLUICE_SPARK_REMOTE) is not `auto`, `local` or an `sc://` URL that
    PySpark can use. The value is shown with its token blanked."""

    def __init__(self, value: str, reason: str = "") -> None:
        self.value, self.reason = without_token(value), reason
        msg = (
            f"Spark remote {self.value!r}: {reason + '; ' if reason else ''}expected `auto` "
            "(attach to the server `sluice spark start` runs, else start a local Spark), "
            "`local` (never attach) or an sc:// URL (sc://HOST:PORT/;token=…)"
        )
        super().__init__(msg)


def url_problem(url: str) -> str | None:
    """What is wrong with the Spark Connect URL `url`, by PySpark's rules (`ChannelBuilder`),
    or None. Checked when the settings are read: PySpark's own errors come later, as a
    traceback, and name the URL with its token."""
    from urllib.parse import urlparse

    if not url.startswith("sc://"):
        return "not an sc:// URL"
    parsed = urlparse("http" + url[2:])
    if parsed.path not in ("", "/"):
        return f"a path ({without_token(parsed.path)!r}) where none may be"
    if parsed.params and not all(p.count("=") == 1 for p in parsed.params.split(";")):
        return "its parameters are not all key=value"
    if not parsed.hostname:
        return "no host"
    try:
        port = parsed.port
    except ValueError:
        port = 0
    if port == 0:
        return "its port is not a number from 1 to 65535"
    return None


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """Everything that decides how the session is built; read once at the edge."""

    master: str = "local[*]"
    app_name: str = "sluice"
    driver_host: str = "127.0.0.1"
    log_level: str = "ERROR"
    ui: bool = False
    conf: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: `auto`, `local` or a Spark Connect URL (`sc://host:port/;token=…`)
    remote: str = AUTO
    #: map (and, when missing, build in the background) the archive of Spark's classes that
    #: starts a local JVM sooner (`pipeline/spark/class_archive.py`)
    class_archive: bool = True
    #: an attach restarts `sluice spark start`'s server once it holds more Python daemons
    #: than this and no client is on it (`connect.recycle_server`): Spark 4.3 never stops
    #: one (about 10 a catch-up run, 1 GB with their workers; `DESIGN.md`, "Where a catch-up's
    #: time goes")
    server_max_daemons: int = 40

    def __post_init__(self) -> None:
        if self.remote not in (AUTO, LOCAL) and (problem := url_problem(self.remote)):
            raise RemoteSettingError(self.remote, problem)

    @classmethod
    def from_config(
        cls,
        config: Mapping | None = None,
        environ: Mapping[str, str] | None = None,
        source: Path | None = None,
    ) -> SparkSettings:
        """Settings from the `[spark]` table of sluice.toml, overridden by `SLUICE_SPARK_*`.

        A key that is not a setting (`mastr`) is a `SettingsError` naming the key, the file
        (`source`, default the sluice.toml in use) and the keys there are."""
        env = os.environ if environ is None else environ
        table = dict((config or {}).get("spark", {}))
        check_keys(table, source)
        extra = {str(k): str(v) for k, v in dict(table.get("conf", {})).items()}
        base = cls()
        return cls(
            master=env.get("SLUICE_SPARK_MASTER") or str(table.get("master", base.master)),
            app_name=str(table.get("app_name", base.app_name)),
            driver_host=env.get("SLUICE_SPARK_DRIVER_HOST")
            or str(table.get("driver_host", base.driver_host)),
            log_level=env.get("SLUICE_SPARK_LOG_LEVEL")
            or str(table.get("log_level", base.log_level)),
            ui=_truthy(env.get("SLUICE_SPARK_UI", table.get("ui", base.ui))),
            conf=tuple(sorted(extra.items())),
            remote=env.get("SLUICE_SPARK_REMOTE") or str(table.get("remote", base.remote)),
            class_archive=_truthy(
                env.get("SLUICE_SPARK_CLASS_ARCHIVE", table.get("class_archive", True))
            ),
            server_max_daemons=_count(
                env.get("SLUICE_SPARK_SERVER_MAX_DAEMONS")
                or table.get("server_max_daemons", base.server_max_daemons),
                "spark.server_max_daemons (SLUICE_SPARK_SERVER_MAX_DAEMONS)",
                source,
            ),
        )


def check_keys(table: Mapping, source: Path | None) -> None:
    """Refuse a `[spark]` key that `SparkSettings` does not have (a typo would silently not
    apply), and a `conf` that is not a table, as the rest of sluice.toml is refused."""
    import difflib

    from pipeline.config import config_path
    from pipeline.settings import SettingsError

    where = str(source or config_path())
    known = [f.name for f in fields(SparkSettings)]
    for key in sorted(map(str, table)):
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean spark.{close[0]}? " if close else ""
            problem = f"unknown key spark.{key} ({hint}the keys of [spark] are {', '.join(known)})"
            raise SettingsError(where, problem)
    if not isinstance(table.get("conf", {}), Mapping):
        problem = 'spark.conf is a table: [spark.conf] "spark.executor.memory" = "2g"'
        raise SettingsError(where, problem)


def _count(value: object, name: str, source: Path | None) -> int:
    """A whole number, 0 or more, or a `SettingsError` naming the setting."""
    from pipeline.config import config_path
    from pipeline.settings import SettingsError

    try:
        count = int(str(value).strip())
    except ValueError:
        count = -1
    if count < 0:
        problem = f"{name} is {value!r}: expected a whole number, 0 or more"
        raise SettingsError(str(source or config_path()), problem)
    return count


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def spark_conf(settings: SparkSettings) -> dict[str, str]:
    """The Spark configuration the settings stand for (before the user's own `conf`)."""
    log4j = f"-Dlog4j2.configurationFile=file:{LOG4J2_PROPERTIES}"
    conf = {
        "spark.master": settings.master,
        "spark.app.name": settings.app_name,
        "spark.driver.host": settings.driver_host,
        "spark.driver.bindAddress": settings.driver_host,
        "spark.ui.enabled": "true" if settings.ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": log4j,
        "spark.executor.extraJavaOptions": log4j,
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.session.timeZone": "UTC",
        # Python data sources stream big Arrow batches; the default 10k rows is small for
        # events of a few bytes and fine for 40 KB ones, so cap by bytes instead.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        "spark.sql.streaming.stopTimeout": "30s",
        # Hadoop's file systems (Spark's checkpoint files) apply their own umask, 022 unless
        # told: owner-only, or group-readable, as every file Sluice writes (`FileModes`)
        "spark.hadoop.fs.permissions.umask-mode": f"{FileModes.from_environment().umask:03o}",
    }
    for key, value in settings.conf:
        # Java options add to Sluice's (which point Spark at its quiet log configuration).
        joined = key.endswith(".extraJavaOptions") and key in conf
        conf[key] = f"{conf[key]} {value}" if joined else value
    return conf


def spark_session(settings: SparkSettings | None = None) -> SparkSession:
    """The process's Spark session, with the `sluice` data sources registered: attached to a
    Spark Connect server when `settings.remote` names one or finds one, else a local JVM."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        if settings is None:
            from pipeline.config import load_config

            settings = SparkSettings.from_config(load_config())
        # PySpark warns on every start that it has not been qualified with the installed
        # pandas; the Arrow paths Sluice uses do not go through pandas.
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
        url = remote_url(settings)
        if url:
            return _attached(url, settings)
        active = local_session(settings)
    from pipeline.spark.source import register_sources

    register_sources(active)
    return active


def _attached(url: str, settings: SparkSettings) -> SparkSession:
    """A session on the server at `url`. One that does not answer its first call is, when
    `auto` found it, a local session instead (stopped or killed since it was found, or a
    restart that died: a found server is a speed-up, never a reason for a job to fail); when
    the settings name it, `SparkUnreachable` (PySpark's own error is a page of gRPC state)."""
    from pipeline.spark.source import register_sources

    active = attach(url)
    try:
        register_sources(active)  # the session's first call to the server
    except SparkUnreachable:  # `attach`'s error handler: UNAVAILABLE, after the retries
        active.stop()
        if settings.remote != AUTO:
            raise SparkUnreachable(url) from None
        log.warning(
            "the Spark Connect server at %s does not answer; starting a local Spark",
            url.split("/;", maxsplit=1)[0],
        )
        # PySpark marks the process as a Connect client on attaching; a local session is
        # refused while the mark is there.
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        active = local_session(settings)
        register_sources(active)
    return active


def remote_url(settings: SparkSettings) -> str | None:
    """The Spark Connect server to attach to: the one named, else (`auto`) the one
    `sluice spark start` runs for this `$SLUICE_HOME` if it is alive and runs this code."""
    if settings.remote == LOCAL:
        return None
    if settings.remote != AUTO:
        return settings.remote
    from pipeline.config import sluice_home
    from pipeline.spark.connect import code_root, running_server

    server = running_server(sluice_home())
    if server is None:
        return None
    if not server.matches_this_process():
        log.warning(
            "not attaching to the Spark Connect server %s: its Python workers run %s from %s, "
            "this process %s from %s; starting a local Spark (restart the server with "
            "`sluice spark stop && sluice spark start` from this install)",
            server.url.split("/;")[0],
            server.python,
            server.code_root,
            sys.executable,
            code_root(),
        )
        return None
    server = _recycled(server, settings)
    return None if server is None else server.url


def _recycled(server: ServerState, settings: SparkSettings) -> ServerState | None:
    """The server to attach to, restarted first if it holds too many Python daemons and no
    client is on it (`connect.recycle_server`); None (a local session) if it stopped."""
    from pipeline.config import sluice_home
    from pipeline.spark.connect import ServerError, recycle_server, running_server

    home = sluice_home()
    conf = partial(server_session_conf, settings)
    try:
        return recycle_server(home, server, settings.server_max_daemons, conf)
    except (OSError, ServerError) as exc:
        log.warning("could not restart the Spark Connect server: %s", exc)
        return running_server(home)


def server_session_conf(settings: SparkSettings) -> dict[str, str]:
    """The configuration `sluice spark start` gives the server's sessions: a local session's,
    with the archive of Spark's classes unless turned off."""
    conf = spark_conf(settings)
    if settings.class_archive:
        from pipeline.spark.class_archive import with_archive

        conf = with_archive(conf)
    return conf


def attach(url: str) -> SparkSession:
    """A Spark Connect session on the server at `url`."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    log.info("attaching to Spark Connect at %s", url.split("/;", maxsplit=1)[0])
    spark = SparkSession.builder.remote(url).getOrCreate()
    # PySpark retries a call to an unreachable server for over 10 minutes; a job whose
    # server died should fail within seconds instead, so that its rerun (a Dagster retry)
    # goes to a local Spark or a restarted server from the same checkpoint.
    policy = DefaultPolicy(max_retries=RECONNECT_RETRIES, max_backoff=RECONNECT_MAX_BACKOFF_MS)
    spark.client.set_retry_policies([policy])
    # ... and then says so in a warning of its own and a multi-line gRPC error (a job's
    # one-line failure read "<_MultiThreadedRendezvous of RPC that terminated with:")
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
    spark.client._handle_error = partial(_unavailable_as_lost, spark.client._handle_error, url)
    return spark


def _unavailable_as_lost(handle: Callable[..., NoReturn], url: str, error: Exception, *args):
    """PySpark's handler of a failed call (`SparkConnectClient._handle_error`, which every
    call goes through), with a server that does not answer (gRPC UNAVAILABLE, after the
    retries) raised as `SparkLost`, one line without the token."""
    import grpc

    code = getattr(error, "code", None)  # a grpc.Call's
    if (
        isinstance(error, grpc.RpcError)
        and callable(code)
        and code() == grpc.StatusCode.UNAVAILABLE
    ):
        raise SparkLost(url) from None
    handle(error, *args)


def local_session(settings: SparkSettings) -> SparkSession:
    """A session on a JVM this process starts (`settings.master`)."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", settings.driver_host)
    conf = spark_conf(settings)
    if settings.class_archive:
        from pipeline.spark.class_archive import with_archive

        conf = with_archive(conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.log_level)
    return spark


def is_remote(spark: SparkSession) -> bool:
    """True for a Spark Connect session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """The cores Spark runs tasks on: the context's, or for a Spark Connect session the
    server's `spark.default.parallelism` (which `sluice spark start` sets), else 2."""
    if not is_remote(spark):
        return spark.sparkContext.defaultParallelism
    return int(spark.conf.get("spark.default.parallelism", "2") or 2)
