"""Where the analytics database's data is: the database file, the exports, the snapshots.

Exports are found in three places, first match wins: `--export SCOPE/STREAM=DIR` on the
command line, each `[streams.NAME]` family of sluice.toml (`exports/NAME` under the home), and
the record every export run leaves (`pipeline.jobs.export.ExportRecord`), so an export written
anywhere (`sluice run export --output /data/x`) is found without being named again. Paths
under the Sluice home are kept relative to it, so that the database can be opened against a
copy of the home (`DESIGN.md`, "Opening a copy")."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import SluiceError

if TYPE_CHECKING:
    from pipeline.settings import SluiceSettings

#: Names of the views every database has; an export named like one gets `_export` appended.
#: The fixed views that read every export's files (a query of them meets an export's absence).
EXPORT_VIEWS = ("samples", "rates", "quarantine", "slice_rows")
FIXED_VIEWS = (
    "samples",
    "rates",
    "quarantine",
    "slices",
    "slice_rows",
    "lineage",
    "replays",
    "sources",
)
PARTITIONS = "date=*/hour=*/*.parquet"
#: What DuckDB reads as wildcards in a path given to `read_parquet` (`glob_escaped`).
GLOB_CHARACTERS = re.compile(r"([\[*?])")
#: What a database path may not hold: DuckDB takes `?` for the start of options and names its
#: write-ahead log after what precedes it, so such a database never commits (`check_database`).
DATABASE_CHARACTERS = "?"
#: Bumped when the views change shape; `sluice sql` refuses a database of another version.
CATALOG_VERSION = 2


class AnalyticsError(SluiceError):
    """The analytics database cannot be built or queried as asked."""

    def __init__(self, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        msg = f"{what}: {reason}"
        super().__init__(msg)


class UnreadableExportFiles(AnalyticsError):
    """Files of an export directory that are not whole Parquet files (no footer, zero bytes).

    An export publishes whole files only (staging, then an atomic rename), so such a file was
    damaged afterwards or put there by something else; DuckDB's glob would read it and fail
    every query of the export's views, so a refresh refuses it, naming it."""

    def __init__(self, export: str, directory: Path, files: list[tuple[Path, str]]) -> None:
        self.export, self.directory, self.files = export, directory, files
        (first, why), more = files[0], len(files) - 1
        others = f" and {more} more" if more else ""
        them, were = ("it", "was") if not more else ("them", "were")
        reason = (
            f"{first} is not a whole Parquet file ({why}){others}: an export publishes whole "
            f"files only, so {them} {were} damaged or put there by something else; move "
            f"{them} out of {directory} (or restore {them} from a copy) and refresh again"
        )
        msg = f"export {export}"
        super().__init__(msg, reason)


class UnsupportedPath(AnalyticsError):
    """A path the analytics database cannot use, for a character in it."""

    def __init__(self, what: str, path: Path, character: str, reason: str) -> None:
        self.path, self.character = path, character
        super().__init__(f"{what} {path}", f"holds {character!r}: {reason}")


def check_database(database: Path) -> None:
    """Refuse (`UnsupportedPath`) a database path DuckDB cannot write: before anything is
    written, rather than a refresh that fails at its commit with a path it never asked for."""
    for character in DATABASE_CHARACTERS:
        if character in str(database):
            reason = (
                "DuckDB cannot keep a database there (it takes the rest for options); set "
                "`[analytics] database` in sluice.toml to a path without it"
            )
            what = "analytics database"
            raise UnsupportedPath(what, database, character, reason)


def glob_escaped(path: Path | str) -> str:
    """`path` as a DuckDB glob pattern that matches only itself: `[`, `*` and `?` each in
    brackets (`[[]`, `[*]`, `[?]`). DuckDB reads every path it is given as a pattern, so a
    directory named `run[1]` would read nothing, or `run1` instead, and `a*b` `aXb` too."""
    return GLOB_CHARACTERS.sub(r"[\1]", str(path))


def unreadable_files(root: Path, pattern: str) -> list[tuple[Path, str]]:
    """The files under `root` matching `pattern` whose Parquet footer cannot be read, each
    with why (read only to explain a failed refresh: it opens every file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    found = []
    for path in sorted(root.glob(pattern)) if root.is_dir() else []:
        try:
            pq.read_metadata(path)
        except (OSError, pa.ArrowException):
            size = path.stat().st_size if path.exists() else 0
            found.append((path, "0 bytes" if size == 0 else f"{size} bytes, no Parquet footer"))
    return found


@dataclass(frozen=True, slots=True)
class AnalyticsPaths:
    """Where analytics reads and writes: the database file (sluice.toml `[analytics]
    database`, default `$SLUICE_HOME/analytics/sluice.duckdb`) and files under the home."""

    home: Path
    database: Path

    @classmethod
    def from_settings(cls, settings: SluiceSettings) -> AnalyticsPaths:
        return cls(settings.home, settings.analytics_database)

    @property
    def snapshots(self) -> Path:
        """The Parquet snapshots `refresh` writes (slices, lineage)."""
        return self.home / "analytics"

    @property
    def slices_snapshot(self) -> Path:
        return self.snapshots / "slices.parquet"

    @property
    def lineage_snapshot(self) -> Path:
        return self.snapshots / "lineage.parquet"

    @property
    def rates_dir(self) -> Path:
        """The rates tables `refresh` maintains, one directory per NIC export."""
        return self.snapshots / "rates"

    @property
    def lineage_dir(self) -> Path:
        return self.home / "lineage"

    @property
    def replays_dir(self) -> Path:
        return self.home / "replays"

    @property
    def plots_dir(self) -> Path:
        return self.home / "plots"

    def stored(self, path: Path | str) -> str:
        """`path` as the views name it: relative to the home when inside it, else absolute."""
        path = Path(path).absolute()
        try:
            return path.relative_to(self.home.absolute()).as_posix()
        except ValueError:
            return path.as_posix()

    def pattern(self, path: Path | str, files: str = "") -> str:
        """A DuckDB glob of `files` (e.g. `PARTITIONS`) under `path`, or of the file `path`,
        as the views name it (`stored`), its own characters escaped (`glob_escaped`): the
        argument of the `sluice_glob` macro."""
        escaped = glob_escaped(self.stored(path))
        return f"{escaped}/{files}" if files else escaped

    def resolve(self, stored: str) -> Path:
        """The inverse of `stored`, against this home."""
        return Path(stored) if Path(stored).is_absolute() else self.home / stored


@dataclass(frozen=True, slots=True)
class ExportSource:
    """One export's output directory, its name, the stream it exports (whose stream
    positions its `_segment`/`_offset` are), its schema when known and other names of it."""

    name: str
    root: Path
    stream: str | None = None
    schema: str | None = None
    time_field: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def view(self) -> str:
        return export_view(self.name)

    @property
    def view_names(self) -> frozenset[str]:
        """The names of the export's two views (its data and its quarantine) as DuckDB
        compares them: without case, so `Network` and `network` are one name."""
        return frozenset({self.view.lower(), f"{self.view}_quarantine".lower()})

    def matches(self, text: str) -> bool:
        """True for the export's name, its stream or another name of it."""
        return text in (self.name, self.stream, *self.aliases)

    @property
    def parquet_root(self) -> Path:
        """The directory holding the `date=`/`hour=` partitions (the root or its parquet/)."""
        for candidate in (self.root / "parquet", self.root):
            if any(candidate.glob("date=*")):
                return candidate
        return self.root / "parquet"

    @property
    def quarantine_root(self) -> Path:
        for candidate in (self.root / "_quarantine", self.root / "parquet" / "_quarantine"):
            if candidate.exists():
                return candidate
        return self.root / "_quarantine"

    def parquet_files(self) -> int:
        return _count(self.parquet_root, PARTITIONS)

    def quarantine_files(self) -> int:
        return _count(self.quarantine_root, "**/*.parquet")


def _count(root: Path, pattern: str) -> int:
    return sum(1 for _ in root.glob(pattern)) if root.is_dir() else 0


# --- finding the exports --------------------------------------------------------------------


def discover_exports(
    settings: SluiceSettings, extra: Iterable[ExportSource] = ()
) -> list[ExportSource]:
    """Exports named on the command line, then each `[streams.NAME]` family of sluice.toml,
    then every export run's record. One directory is one export, whichever symbolic links
    lead to it (`_same_directory`); a view name given twice keeps the first (a later one is
    named after its stream and directory). View names are
    compared as DuckDB compares them, without case, and with the export's quarantine view:
    `Network` after `network`, or `network/quarantine` beside `network`, would otherwise
    replace a view of the first export and count its rows twice.

    A family's directory holds the export of the stream its runs recorded there, whatever the
    family names: a `sluice run export --stream examples/network` into the directory of the
    family that exports its mirror labels its rows `examples/network`, so that `slice_rows`
    finds them by that stream's positions. The family's mirror stream is the label until an
    export has run, or when exports of several streams were recorded there."""
    from pipeline.jobs.export import registered_exports

    records = registered_exports(settings.home)
    streams_in: dict[Path, set[str]] = {}
    for r in records:
        streams_in.setdefault(_same_directory(Path(r.output)), set()).add(r.stream)

    def exported(root: Path, configured: str) -> str:
        found = streams_in.get(_same_directory(root), set())
        return next(iter(found)) if len(found) == 1 else configured

    families = [
        ExportSource(
            f.name,
            f.export_dir,
            exported(f.export_dir, f.mirror_stream),
            f.schema,
            aliases=(f.stream, f.mirror_stream),
        )
        for f in settings.streams
    ]
    recorded = [
        ExportSource(r.stream, Path(r.output), r.stream, r.schema, r.time_field) for r in records
    ]
    by_root: dict[Path, ExportSource] = {}
    names: set[str] = set()  # the views taken so far, lower case (`view_names`)
    for given in (*extra, *families, *recorded):
        root = _same_directory(given.root)
        known = by_root.get(root)
        if known is not None:
            by_root[root] = _merge(known, given)
            continue
        source = _renamed(given, names) if given.view_names & names else given
        names |= source.view_names
        by_root[root] = source
    return list(by_root.values())


def _same_directory(root: Path) -> Path:
    """What makes two names of a directory one export: the directory they lead to, symbolic
    links followed (`/data/link` and its target, a home reached through a link and through
    its target), so that its files are read by one view, not counted by two."""
    return root.expanduser().resolve()


def _merge(known: ExportSource, other: ExportSource) -> ExportSource:
    """What a second mention of one directory adds: the schema, stream, time field."""
    return ExportSource(
        known.name,
        known.root,
        known.stream or other.stream,
        known.schema or other.schema,
        known.time_field or other.time_field,
        tuple(dict.fromkeys((*known.aliases, *other.aliases))),
    )


def _renamed(source: ExportSource, taken: set[str]) -> ExportSource:
    base = f"{source.name}/{source.root.name}"
    name, n = base, 2
    while ExportSource(name, source.root).view_names & taken:
        name, n = f"{base}_{n}", n + 1
    return ExportSource(
        name, source.root, source.stream, source.schema, source.time_field, source.aliases
    )


def parse_export_option(text: str) -> ExportSource:
    """`SCOPE/STREAM=DIR` from the command line; DIR must be a directory that exists (an
    export's output, which its first run creates): a misspelt one would otherwise be
    refreshed as an export with no files yet, and its view stay empty without a word."""
    stream, eq, root = text.partition("=")
    msg = f"--export {text!r}"
    if not eq or stream.count("/") != 1 or not root:
        reason = "expected SCOPE/STREAM=DIR, e.g. examples/network=/data/network-export"
        raise AnalyticsError(msg, reason)
    directory = Path(root).expanduser().absolute()
    if not directory.is_dir():
        found = "is not a directory" if directory.exists() else "does not exist"
        reason = (
            f"{directory} {found}: give the directory an export writes to (the --output of "
            "`sluice run export`)"
        )
        raise AnalyticsError(msg, reason)
    return ExportSource(stream, directory, stream)


def export_view(name: str) -> str:
    """The view of the export `name`: its name as an SQL identifier (`_export` added when it
    would be a fixed view's)."""
    view = re.sub(r"[^A-Za-z0-9_]", "_", name.replace("/", "_"))
    return f"{view}_export" if view.lower() in FIXED_VIEWS else view
