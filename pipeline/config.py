"""Where Sluice keeps its state, and where its configuration file is and what it says, raw.

The configuration comes from one place: `sluice.toml` (in the working directory, or
`$SLUICE_CONFIG`) overridden by `SLUICE_*` environment variables, read when asked for, never
at import. Typed, validated settings are made from it in `pipeline/settings.py`. This leaf
also holds the rules every layer shares: which `SLUICE_*` variables exist (`VARIABLES`), what
a store URI may look like (`checked_store_uri`: a relative embedded directory is under the
home), and the modes of the files Sluice writes (`FileModes`: owner-only by default).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SluiceError

#: The schemes `pipeline.streams.open_store` opens.
STORE_SCHEMES = ("embedded", "pravega", "pravegas", "tcp", "tls")

#: Every `SLUICE_*` variable Sluice reads, with what it sets. A name ending in `_` is a family
#: (`SLUICE_STORE_CLOUD`); the keys of a family are checked where the family is read
#: (`pipeline/settings.py`). Any other `SLUICE_*` variable is refused as a likely typo.
VARIABLES: dict[str, str] = {
    "SLUICE_HOME": "the directory of everything written at run time (default ./.sluice)",
    "SLUICE_CONFIG": "the configuration file (default ./sluice.toml)",
    "SLUICE_STORE": "the default (edge) store's URI",
    "SLUICE_STORE_": "SLUICE_STORE_<NAME>: the URI of store NAME of sluice.toml",
    "SLUICE_CHECKS_": "SLUICE_CHECKS_<KEY>: a key of [checks]",
    "SLUICE_DAGSTER_": "SLUICE_DAGSTER_<KEY>: a key of [dagster]",
    "SLUICE_EXPORTS_": "SLUICE_EXPORTS_<KEY>: a key of [exports]",
    "SLUICE_GROUP_READ": "true: files Sluice writes are group-readable (default owner-only)",
    "SLUICE_SPARK_MASTER": "the Spark master URL",
    "SLUICE_SPARK_DRIVER_HOST": "the address the Spark driver binds to",
    "SLUICE_SPARK_LOG_LEVEL": "Spark's log level",
    "SLUICE_SPARK_UI": "true: start the Spark UI",
    "SLUICE_SPARK_REMOTE": "auto, local or an sc:// URL: the Spark Connect server jobs attach to",
    "SLUICE_SPARK_CLASS_ARCHIVE": "false: local JVMs start without the archive of Spark's classes",
    "SLUICE_SPARK_SERVER_MAX_DAEMONS": "restart the Spark Connect server past this many Python "
    "daemons",
    "SLUICE_IN_PROCESS_BYTES": "a run until caught up whose backlog is at most this many bytes "
    "runs it in its own process, without Spark (0: always Spark; default 32 MiB)",
    "SLUICE_PRAVEGA_USER": "Pravega user",
    "SLUICE_PRAVEGA_PASSWORD_FILE": "a file holding the Pravega password",
    "SLUICE_PRAVEGA_PASSWORD": "the Pravega password (prefer the _FILE variable)",
    "SLUICE_PRAVEGA_TRUSTSTORE": "CA certificate of a TLS Pravega",
    "SLUICE_PRAVEGA_ALLOW_PLAINTEXT_AUTH": "true: send credentials without TLS",
    "SLUICE_PRAVEGA_CONNECT_TIMEOUT": "seconds to connect to Pravega",
    "SLUICE_PRAVEGA_RPC_TIMEOUT": "seconds per Pravega call",
    "SLUICE_PRAVEGA_CLIENT_LOG": "the Pravega client's log level",
    "SLUICE_COLLECTOR_FAILPOINTS": "crash points of the collector (tests)",
    # read by docker/compose.yaml on the host, not by Sluice; allowed in the same shell
    "SLUICE_IMAGE_TAG": "docker compose: the images' tag",
    "SLUICE_CLOUD_STORE": "docker compose: the cloud store's URI",
    "SLUICE_BIND_ADDRESS": "docker compose: the address published ports bind to",
    "SLUICE_PRAVEGA_PASSWORD_SECRET": "docker compose: the Pravega password's secret file",
    # tests and benchmarks
    "SLUICE_TEST_": "switches of the test suite (SLUICE_TEST_PRAVEGA=tcp://…)",
    "SLUICE_CRASH_SEED": "the seed of the crash tests",
    "SLUICE_BENCH_DIR": "where benchmarks keep their data",
}

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


class ConfigFileError(SluiceError, ValueError):
    """The configuration file is missing where it was named, or is not valid TOML."""

    def __init__(self, path: Path, problem: str, line: int | None = None) -> None:
        self.path, self.problem, self.line = path, problem, line
        where = f"{path}, line {line}" if line is not None else str(path)
        msg = f"{where}: {problem}"
        super().__init__(msg)


class EnvironmentVariableError(SluiceError, ValueError):
    """A `SLUICE_*` variable that Sluice does not know, or whose value it cannot use."""

    def __init__(self, variable: str, problem: str, hint: str) -> None:
        self.variable, self.problem, self.hint = variable, problem, hint
        msg = f"environment variable {variable}: {problem}; {hint}"
        super().__init__(msg)


class StoreUriError(SluiceError, ValueError):
    """A text that should name a stream store does not."""

    def __init__(self, where: str, uri: str) -> None:
        self.where, self.uri = where, uri
        msg = (
            f"{where}: {uri!r} is not a store URI: use embedded:<dir> (relative to the home, "
            "$SLUICE_HOME) or pravega://host:9090 (pravegas:// for TLS)"
        )
        super().__init__(msg)


def sluice_home() -> Path:
    """Everything written at run time lives under this directory (`$SLUICE_HOME`, `./.sluice`)."""
    return Path(os.environ.get("SLUICE_HOME") or ".sluice").expanduser().absolute()


def config_path() -> Path:
    return Path(os.environ.get("SLUICE_CONFIG") or "sluice.toml").expanduser().absolute()


def load_config(path: Path | None = None) -> dict:
    """The parsed `sluice.toml`; an empty table when there is none in the working directory.

    A file named by `$SLUICE_CONFIG` (or by `path`) must exist (`SLUICE_CONFIG=/dev/null`
    runs without one), and a syntax error names the file and the line."""
    named = path is not None or bool(os.environ.get("SLUICE_CONFIG"))
    path = path or config_path()
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        if not named:
            return {}
        problem = (
            "no such configuration file: fix SLUICE_CONFIG (unset: ./sluice.toml; /dev/null: "
            "no configuration)"
        )
        raise ConfigFileError(path, problem) from None
    except IsADirectoryError:
        raise ConfigFileError(path, "is a directory, not a configuration file") from None
    except UnicodeDecodeError as exc:
        raise ConfigFileError(path, f"is not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        found = _TOML_POSITION.search(text)
        line = int(found.group(1)) if found else None
        reason = _TOML_POSITION.sub("", text)
        column = f" (column {found.group(2)})" if found else ""
        problem = f"not valid TOML: {reason}{column}; fix the syntax and retry"
        raise ConfigFileError(path, problem, line) from None


def default_store_uri() -> str:
    """The default (edge) store: `$SLUICE_STORE`, else `$SLUICE_STORE_EDGE`, else sluice.toml's
    `[stores.edge]` (`uri`, or an `embedded` directory under the home), else the embedded
    store in `$SLUICE_HOME/streams`."""
    for variable in ("SLUICE_STORE", "SLUICE_STORE_EDGE"):
        if uri := os.environ.get(variable):
            return checked_store_uri(uri, variable)
    edge = load_config().get("stores", {}).get("edge", {})
    if uri := edge.get("uri"):
        return checked_store_uri(str(uri), "stores.edge.uri")
    if directory := edge.get("embedded"):
        return f"embedded:{(sluice_home() / Path(directory).expanduser()).absolute()}"
    return f"embedded:{sluice_home() / 'streams'}"


def canonical_store(uri: str) -> str:
    """One spelling per store: an embedded store's directory as the path it resolves to
    (`embedded:` alone is the default store; a link, `..` or a trailing `/` name the same one),
    any other store as written. What a job's checkpoint is named by and compared with."""
    scheme, _, rest = uri.partition(":")
    if scheme != "embedded":
        return uri
    directory = rest or default_store_uri().partition(":")[2]
    return f"embedded:{Path(directory).expanduser().resolve()}"


def same_store(a: str, b: str) -> bool:
    """Whether two store URIs name one store (`canonical_store`)."""
    return canonical_store(a) == canonical_store(b)


def is_store_uri(text: str) -> bool:
    """Whether `text` has the form of a store URI (rather than a store's name)."""
    scheme, colon, _ = text.partition(":")
    return bool(colon) and scheme in STORE_SCHEMES


def checked_store_uri(uri: str, where: str, home: Path | None = None) -> str:
    """`uri` if it names a store, with a relative embedded directory made absolute under the
    home (`$SLUICE_HOME`), as sluice.toml's `embedded = "cloud"` is; else `StoreUriError`."""
    uri = uri.strip()
    if not is_store_uri(uri):
        raise StoreUriError(where, uri)
    scheme, _, rest = uri.partition(":")
    if scheme != "embedded":
        if not rest.startswith("//") or len(rest) <= 2:
            raise StoreUriError(where, uri)
        return uri
    if not rest:
        return uri  # `embedded:` alone is the default store (`open_store`)
    directory = Path(rest).expanduser()
    if not directory.is_absolute():
        directory = (home or sluice_home()) / directory
    return f"embedded:{directory.absolute()}"


def under_home(path: Path, home: Path | None = None) -> Path:
    """A path given on the command line for run-time output: relative paths are under the
    home (`$SLUICE_HOME`), absolute ones are kept."""
    path = path.expanduser()
    return path if path.is_absolute() else ((home or sluice_home()) / path).absolute()


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`SLUICE_*` variables of `environ` that are neither in `VARIABLES` nor of a family."""
    families = tuple(name for name in VARIABLES if name.endswith("_"))
    return sorted(
        name
        for name in environ
        if name.startswith("SLUICE_")
        and name not in VARIABLES
        and not (name.startswith(families) and name not in families)
    )


def flag_variable(environ: Mapping[str, str], variable: str) -> bool:
    """A true/false variable (1/0, true/false, yes/no, on/off; unset is false)."""
    value = environ.get(variable, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvironmentVariableError(variable, f"{value!r} is not true or false", "use 1 or 0")


@dataclass(frozen=True, slots=True)
class FileModes:
    """The modes of the files and directories Sluice creates: owner-only (0600/0700) by
    default, group-readable (0640/0750) with `SLUICE_GROUP_READ=1`. `apply()` sets the
    process's umask to match, so that every file the process (and its children: Spark's
    workers, the NIC sampler) writes follows, whoever writes it."""

    group_read: bool = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> FileModes:
        env = os.environ if environ is None else environ
        return cls(flag_variable(env, "SLUICE_GROUP_READ"))

    @property
    def file(self) -> int:
        return 0o640 if self.group_read else 0o600

    @property
    def directory(self) -> int:
        return 0o750 if self.group_read else 0o700

    @property
    def umask(self) -> int:
        return 0o027 if self.group_read else 0o077

    def apply(self) -> int:
        """Set the process's umask; returns the previous one."""
        return os.umask(self.umask)
