"""The rates table: every NIC export's per-sample rates, computed once per new export file.

A refresh (`catalog.refresh`, the only writer) brings each NIC export's table up to date
under `$SLUICE_HOME/analytics/rates/<export view>/`, and the `rates` view just scans it.
The table is a list of generations, each one Parquet file of rates (`g00000007.parquet`)
and the last sample of every NIC up to it (`g00000007.carry.parquet`); `manifest.json`
names them and the export files each was computed from. A refresh computes a new
generation from the export files no generation holds, with the carry of the last one as
every NIC's previous sample, so rates run on across events, batches, files and refreshes
exactly as the window functions of `rates.py` define them over all the files at once.

Late data (a NIC's new sample at or before its carried last one), an export file changed
or gone, or a generation file missing or damaged: the table is recomputed from the first
generation that it touches, never trusted. The details: `DESIGN.md`, "The rates table"."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from pipeline import durable
from pipeline.analytics.rates import KEY, NIC_COLUMNS, rates_sql
from pipeline.analytics.sources import PARTITIONS, glob_escaped

if TYPE_CHECKING:
    import duckdb

MANIFEST = "manifest.json"
#: Bumped when what a generation file holds changes: every table is then recomputed.
FORMAT_VERSION = 1
#: A last generation of fewer rows is computed again with the next new files (about a second
#: of work), so that frequent refreshes do not leave a file per refresh for the view to open.
MERGE_BELOW = 1_000_000
_NUMBER = re.compile(r"g(\d{8})\.")


class SourceFile(TypedDict):
    path: str  # relative to the export's Parquet root
    size: int
    mtime_ns: int


class Generation(TypedDict):
    number: int
    rows: int
    size: int  # bytes of the rates file
    carry_size: int  # bytes of the carry file
    sources: list[SourceFile]


class Manifest(TypedDict):
    version: Literal[1]
    definition: str  # what the rates were computed with: format, export root, time column
    next: int  # the number of the next generation (never reused)
    generations: list[Generation]


@dataclass(slots=True)
class RatesUpdate:
    """What one refresh did to one export's table: the files the view reads, the samples
    it computed, and why it recomputed generations (None: it only appended, or nothing)."""

    directory: Path
    files: list[Path]
    rows: int
    computed: int = 0
    recomputed_from: int | None = None
    reason: str | None = None
    obsolete: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        kept = f"{self.rows:,} samples in {len(self.files)} generation(s)"
        if self.reason is None:
            return f"{kept}, {self.computed:,} computed now"
        return f"{kept}, {self.computed:,} computed now ({self.reason})"


def _sql_str(value: object) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _read(path: Path) -> str:
    """`path` as `read_parquet` must be given it: a pattern matching only itself."""
    return _sql_str(glob_escaped(path))


def _listed(files: list[Path]) -> str:
    return "[" + ", ".join(_read(f) for f in files) + "]"


def _rates_file(directory: Path, number: int) -> Path:
    return directory / f"g{number:08d}.parquet"


def _carry_file(directory: Path, number: int) -> Path:
    return directory / f"g{number:08d}.carry.parquet"


def _fingerprint(root: Path, path: Path) -> SourceFile:
    stat = path.stat()
    return {
        "path": path.relative_to(root).as_posix(),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }


def _read_manifest(directory: Path, definition: str) -> tuple[Manifest | None, str | None]:
    """The manifest, or (None, why it cannot be trusted)."""
    path = directory / MANIFEST
    if not path.exists():
        return None, "no rates table yet" if not directory.exists() else "its manifest is gone"
    try:
        manifest = json.loads(path.read_text())
        generations = manifest["generations"]
        version, stored = manifest["version"], manifest["definition"]
        int(manifest["next"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, "its manifest is unreadable"
    if version != 1 or not isinstance(generations, list):
        return None, f"its manifest is of another version ({version})"
    if stored != definition:
        return None, "the export's definition changed"
    return manifest, None


def memory_limit_mb() -> int:
    """A quarter of the machine's memory (DuckDB's own default is 80%)."""
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return max(256, pages * size // 4 // 2**20)


def _pending(kept: list[Generation], found: dict[str, Path]) -> list[Path]:
    """The export files no kept generation was computed from."""
    held = {s["path"] for g in kept for s in g["sources"]}
    return [path for name, path in found.items() if name not in held]


def _intact(directory: Path, generation: Generation) -> bool:
    """The generation's files are there, of the recorded size, and the rates file's Parquet
    footer holds the recorded number of rows."""
    import pyarrow.parquet as pq

    number = generation["number"]
    rates, carry = _rates_file(directory, number), _carry_file(directory, number)
    try:
        if rates.stat().st_size != generation["size"]:
            return False
        if carry.stat().st_size != generation["carry_size"]:
            return False
        return pq.read_metadata(rates).num_rows == generation["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


@dataclass(slots=True)
class _Plan:
    """Which generations stay, and why the others are recomputed."""

    keep: int  # generations[:keep] stay
    reason: str | None = None

    def back_to(self, index: int, reason: str) -> None:
        if index < self.keep:
            self.keep, self.reason = index, reason


class RatesTable:
    """One export's rates table: `update` it inside a refresh, on the refresh's connection."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        directory: Path,
        parquet_root: Path,
        time: str,
        stored_root: str,
        *,
        merge_below: int | None = None,
    ) -> None:
        """`time`: the export view's `time` expression; `stored_root`: the Parquet root as the
        views name it (relative to the home, so that a copy of the home keeps its table);
        `merge_below`: a last generation of fewer rows is computed again with new files."""
        self.con, self.directory, self.root, self.time = con, directory, parquet_root, time
        self.merge_below = MERGE_BELOW if merge_below is None else merge_below
        # the export's root is part of the definition: another export of this name starts over
        self.definition = f"rates-{FORMAT_VERSION}|{stored_root}|{time}"

    def update(self, log: Callable[[str], None] | None = None) -> RatesUpdate:
        """Bring the table up to date with the export's files; return what the view reads.

        Files the new manifest no longer names are listed in `obsolete`: the caller removes
        them once the views that read them are replaced (`sweep`)."""
        manifest, why = _read_manifest(self.directory, self.definition)
        generations = list(manifest["generations"]) if manifest is not None else []
        found = {p.relative_to(self.root).as_posix(): p for p in sorted(self.root.glob(PARTITIONS))}
        plan = self._plan(generations, found, why if self.directory.exists() else None)
        kept = generations[: plan.keep]
        pending = _pending(kept, found)
        computed = 0
        if pending or plan.keep < len(generations) or manifest is None:
            number = max(manifest["next"] if manifest is not None else 0, self._unused_number())
            if pending:
                previous = kept[-1]["number"] if kept else None
                kept.append(self._compute(number, previous, pending))
                computed, number = kept[-1]["rows"], number + 1
            self._write_manifest(number, kept)
        if log is not None and plan.reason is not None:
            log(f"recomputed from generation {plan.keep}: {plan.reason}")
        files = [_rates_file(self.directory, g["number"]) for g in kept]
        return RatesUpdate(
            self.directory,
            files,
            sum(g["rows"] for g in kept),
            computed,
            plan.keep if plan.reason is not None else None,
            plan.reason,
            self._obsolete(kept),
        )

    def _plan(
        self, generations: list[Generation], found: dict[str, Path], why: str | None
    ) -> _Plan:
        """Which generations stay: up to the first damaged one, or one whose export files
        changed, or one late data reaches back to; a small last one is merged with new files."""
        plan = _Plan(len(generations), why)
        self._check_generations(generations, found, plan)
        pending = _pending(generations[: plan.keep], found)
        if pending and plan.keep == len(generations) and plan.keep:
            if generations[-1]["rows"] < self.merge_below:
                plan.keep -= 1  # computed again with the new files: generations stay few
        if pending:
            self._check_late(generations[: plan.keep], pending, plan)
        return plan

    def _write_manifest(self, number: int, kept: list[Generation]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        written: Manifest = {
            "version": 1,
            "definition": self.definition,
            "next": number,
            "generations": kept,
        }
        durable.write_json(self.directory / MANIFEST, written)

    def _obsolete(self, kept: list[Generation]) -> list[Path]:
        """Every file of the directory the manifest does not name (a crashed write's staging
        file too: the refresh holds the database, so no other one is writing here)."""
        if not self.directory.exists():
            return []
        keep = {self.directory / MANIFEST}
        for generation in kept:
            number = generation["number"]
            keep |= {_rates_file(self.directory, number), _carry_file(self.directory, number)}
        return [p for p in self.directory.iterdir() if p not in keep]

    def _unused_number(self) -> int:
        """A generation number no file in the directory has (a lost manifest's files stay
        until the views stop naming them)."""
        if not self.directory.is_dir():
            return 0
        numbers = [int(m[1]) for p in self.directory.iterdir() if (m := _NUMBER.match(p.name))]
        return max(numbers, default=-1) + 1

    # --- what must be recomputed ---------------------------------------------------------

    def _check_generations(
        self, generations: list[Generation], found: dict[str, Path], plan: _Plan
    ) -> None:
        """Back to the first generation that is damaged or whose export files changed."""
        for index, generation in enumerate(generations):
            if not _intact(self.directory, generation):
                plan.back_to(index, f"generation {generation['number']} is missing or damaged")
                return
            for source in generation["sources"]:
                path = found.get(source["path"])
                if path is None:
                    plan.back_to(index, f"export file {source['path']} is gone")
                    return
                if _fingerprint(self.root, path) != source:
                    plan.back_to(index, f"export file {source['path']} changed")
                    return

    def _check_late(self, kept: list[Generation], pending: list[Path], plan: _Plan) -> None:
        """Back to the first generation holding a sample after a NIC's earliest new one."""
        if not kept:
            return
        carries = [_carry_file(self.directory, g["number"]) for g in kept]
        key = ", ".join(KEY)
        late = self.con.execute(
            f"""
            WITH new AS (
                SELECT RemoteAddr, Interface, min(({key})) AS first
                FROM ({self._rows(pending)}) GROUP BY ALL
            ), carried AS (
                SELECT RemoteAddr, Interface, ({key}) AS last, filename
                FROM read_parquet({_listed(carries)}, filename = true)
            )
            SELECT min(c.filename), min(n.RemoteAddr || '/' || n.Interface)
            FROM new n JOIN carried c USING (RemoteAddr, Interface)
            WHERE c.last >= n.first
            """
        ).fetchone()
        if late[0] is None:
            return
        index = carries.index(Path(late[0]))
        plan.back_to(index, f"late data for {late[1]} (a sample at or before one it had)")

    # --- computing a generation ----------------------------------------------------------

    def _rows(self, files: list[Path]) -> str:
        """The NIC columns (and `time`) of export files, typed as the carry holds them."""
        typed = ", ".join(f"{name}::{kind} AS {name}" for name, kind in NIC_COLUMNS.items())
        return (
            f"SELECT {self.time} AS time, {typed} "
            f"FROM read_parquet({_listed(files)}, union_by_name = true)"
        )

    def _compute(self, number: int, previous: int | None, files: list[Path]) -> Generation:
        """Generation `number`: the rates of `files`' samples, each NIC's first one following
        the carry of generation `previous`; and the new carry."""
        rows = f"SELECT false AS carried, * FROM ({self._rows(files)})"
        if previous is not None:
            carry = _carry_file(self.directory, previous)
            rows += f" UNION ALL SELECT true AS carried, * FROM read_parquet({_read(carry)})"
        relation = f"(SELECT NULL::VARCHAR AS export, NULL::VARCHAR AS stream, * FROM ({rows}))"
        rates = _rates_file(self.directory, number)
        self.directory.mkdir(parents=True, exist_ok=True)
        # the row order of a generation means nothing (the view has none): let DuckDB write
        # in parallel; zstd halves the table's size for the same scan speed
        self.con.execute("SET preserve_insertion_order = false")
        # a first build sorts every sample: spill beyond a share of the memory, beside the
        # database (`<database>.tmp`), rather than starve the exports and Spark beside it
        self.con.execute(f"SET memory_limit = '{memory_limit_mb()}MB'")
        with durable.atomic_path(rates) as staging:
            self.con.execute(
                f"COPY ({rates_sql(relation, only='NOT carried')}) TO {_sql_str(staging)} "
                "(FORMAT parquet, COMPRESSION zstd)"
            )
        carry = _carry_file(self.directory, number)
        sample = ", ".join(f"{c!r}: {c}" for c in ("time", *NIC_COLUMNS))
        last = f"max_by({{{sample}}}, ({', '.join(KEY)}))"
        with durable.atomic_path(carry) as staging:
            self.con.execute(
                f"COPY (SELECT last.* FROM (SELECT {last} AS last FROM ({rows}) "
                f"GROUP BY RemoteAddr, Interface)) TO {_sql_str(staging)} (FORMAT parquet)"
            )
        import pyarrow.parquet as pq

        return {
            "number": number,
            "rows": pq.read_metadata(rates).num_rows,
            "size": rates.stat().st_size,
            "carry_size": carry.stat().st_size,
            "sources": [_fingerprint(self.root, p) for p in files],
        }


def sweep(paths: list[Path]) -> None:
    """Remove files (or directories) no manifest names any more: after the views that read
    them were replaced, so no view ever names a file that is gone."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for parent in {p.parent for p in paths}:
        if parent.is_dir():
            durable.fsync_dir(parent)


def stale_tables(rates_root: Path, current: set[Path]) -> list[Path]:
    """Table directories of exports no longer known (or no longer NIC exports)."""
    if not rates_root.is_dir():
        return []
    return [p for p in rates_root.iterdir() if p.is_dir() and p not in current]
