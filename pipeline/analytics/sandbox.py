"""Reading the analytics database: read-only, inside DuckDB's own sandbox.

`sluice sql`, `sluice plot` and the Dagster analytics resource open the database here and
only here. Before any statement runs, the connection is read-only, its paths resolve against
this Sluice home (the `sluice_home` variable), and DuckDB's own settings close everything but
the directories the views read (the `sources` view): `allowed_directories` lists them,
`enable_external_access = false` shuts the rest of the file system and the network,
`autoinstall_known_extensions`/`autoload_known_extensions = false` keep extensions out, and
`lock_configuration = true` keeps a query from undoing any of it. Statements other than
SELECT, EXPLAIN, PRAGMA and CALL are refused before they run: `COPY … TO` a directory the
views read would otherwise still write there. Every refusal is one line (`QueryRefused`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from pipeline.analytics.sources import (
    CATALOG_VERSION,
    AnalyticsError,
    AnalyticsPaths,
    check_database,
    glob_escaped,
)

READING = ("SELECT", "EXPLAIN", "PRAGMA", "CALL")
WHAT_IT_DOES = {
    "COPY": "COPY reads or writes files",
    "EXPORT": "EXPORT DATABASE writes files",
    "LOAD": "INSTALL and LOAD install or load extensions",
    "ATTACH": "ATTACH opens another database",
    "SET": "SET changes the session's settings",
    "VARIABLE_SET": "SET VARIABLE changes the session",
}
SANDBOX = (
    "sluice sql reads only Sluice's data directories (SELECT * FROM sources), and cannot "
    "write files, install or load extensions, or reach the network"
)


class QueryRefused(AnalyticsError):
    """A statement the sandbox does not run, or a file or URL it does not reach."""

    def __init__(self, statement: str, reason: str) -> None:
        self.statement = statement
        super().__init__("refused", reason)


#: What to do about DuckDB's errors of the files a view reads (the first line of its error
#: contains the key): an export gone since the refresh, a file that is not whole Parquet.
FILE_ADVICE = {
    "No files found that match the pattern": "files a view read are gone since the last "
    "refresh, an export moved or deleted: run `sluice analytics refresh`",
    "too small to be a Parquet file": "a file in an export directory is not whole Parquet: "
    "`sluice analytics refresh` names every such file; move them away",
    "No magic bytes found": "a file in an export directory is not whole Parquet: "
    "`sluice analytics refresh` names every such file; move them away",
}


def _failed(exc: duckdb.Error) -> str:
    """DuckDB's first line, and what to do when it is about the files a view reads."""
    said = str(exc).splitlines()[0]
    advice = next((a for key, a in FILE_ADVICE.items() if key in said), None)
    return f"{said} ({advice})" if advice else said


def _sql_str(value: object) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _check_version(con: duckdb.DuckDBPyConnection, paths: AnalyticsPaths) -> None:
    try:
        version = con.execute("SELECT sluice_catalog_version()").fetchone()[0]
    except duckdb.Error:
        version = None
    if version is None:  # the first refresh failed, or the views predate the version macro
        reason = (
            "no refresh of this Sluice has built its views (the first one failed, or an older"
            " Sluice built them): run `sluice analytics refresh`"
        )
        raise AnalyticsError(str(paths.database), reason)
    if version != CATALOG_VERSION:
        what = "an older Sluice" if version < CATALOG_VERSION else "a newer one"
        reason = (
            f"its views were built by {what} (version {version}, this Sluice reads "
            f"{CATALOG_VERSION}): rebuild them with `sluice analytics refresh`"
        )
        raise AnalyticsError(str(paths.database), reason)


def _allowed(directories: list[str]) -> list[str]:
    """`allowed_directories` for the directories the views read. DuckDB checks the pattern a
    view reads as well as every file it finds, so a directory whose name holds `[`, `*` or
    `?` is allowed as itself and as its escaped pattern (`glob_escaped`); both are literal
    prefixes, so `a*b/` lets no query into `aXb/`."""
    allowed = [d.rstrip("/") + "/" for d in directories]
    return list(dict.fromkeys([*allowed, *(glob_escaped(d) for d in allowed)]))


def _lock_down(con: duckdb.DuckDBPyConnection, directories: list[str]) -> None:
    allowed = "[" + ", ".join(_sql_str(d) for d in _allowed(directories)) + "]"
    con.execute(f"SET allowed_directories = {allowed}")
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


@contextmanager
def open_database(paths: AnalyticsPaths) -> Iterator[duckdb.DuckDBPyConnection]:
    """The database, read-only and sandboxed, for the length of the block."""
    check_database(paths.database)
    if not paths.database.exists():
        reason = "no database there yet: build it with `sluice analytics refresh`"
        raise AnalyticsError(str(paths.database), reason)
    try:
        con = duckdb.connect(str(paths.database), read_only=True)
    except duckdb.Error as exc:
        reason = f"{str(exc).splitlines()[0]} (is a refresh writing it? retry when it is done)"
        msg = f"cannot open {paths.database}"
        raise AnalyticsError(msg, reason) from None
    try:
        _check_version(con, paths)
        con.execute(f"SET VARIABLE sluice_home = {_sql_str(paths.home.absolute())}")
        con.execute("SET TimeZone = 'UTC'")
        directories = [row[0] for row in con.execute("SELECT location FROM sources").fetchall()]
        _lock_down(con, directories)
        yield con
    finally:
        con.close()


def check_statements(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse empty SQL and every statement that is not a read."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        msg = "query failed"
        raise AnalyticsError(msg, str(exc).splitlines()[0]) from None
    if not statements:
        reason = 'no SQL given: pass a statement, e.g. sluice sql "SELECT * FROM rates LIMIT 5"'
        msg = "sluice sql"
        raise AnalyticsError(msg, reason)
    for statement in statements:
        kind = statement.type.name
        if kind not in READING:
            said = WHAT_IT_DOES.get(kind, f"{kind} statements change things")
            reason = f"{said}; {SANDBOX}"
            raise QueryRefused(statement.query.strip(), reason)


def run(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[list[str], list[tuple]]:
    """Run checked SQL on an open database; column names and rows of the last statement."""
    check_statements(con, sql)
    try:
        cursor = con.execute(sql)
        columns = [d[0] for d in cursor.description or ()]
        return columns, cursor.fetchall() if columns else []
    except duckdb.PermissionException as exc:
        said = str(exc).splitlines()[0].removeprefix("Permission Error: ")
        raise QueryRefused(sql.strip(), f"{said}; {SANDBOX}") from None
    except duckdb.Error as exc:
        msg = "query failed"
        raise AnalyticsError(msg, _failed(exc)) from None


def query(paths: AnalyticsPaths, sql: str) -> tuple[list[str], list[tuple]]:
    """Run SQL on the database in the sandbox; column names and rows."""
    with open_database(paths) as con:
        return run(con, sql)
