"""Asset checks of a family: sample timestamps, quarantine rate, mirror lag.

- `no_duplicate_samples` (blocking): no sensor has two exported samples with one timestamp;
- `quarantine_rate` (blocking): the share of refused events stays under its `[checks]` limit;
- `no_sample_gaps` (warning): no step between samples of one sensor is longer than
  `max_sample_gap_seconds` in what the latest export run wrote;
- `mirror_lag` (warning): the mirror's committed position is near the edge tail.

They run right after their asset; a failing blocking check keeps the analytics views back.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import duckdb

from assets.catch_up import FamilyJobs
from assets.keys import export_checks_op, export_key, mirror_key
from pipeline.analytics.sources import glob_escaped
from pipeline.jobs.checkpoint import committed_progress
from pipeline.settings import ChecksTable, StreamFamily
from resources.stores import StreamStoresResource

NS = 1_000_000_000


def parquet_glob(output: Path) -> str | None:
    """The DuckDB pattern of the export's Parquet files (None before the first), its
    directory's own `[`, `*` and `?` escaped so that it reads that directory only."""
    folder = output / "parquet"
    found = any(folder.glob("date=*/hour=*/*.parquet"))
    return f"{glob_escaped(folder)}/date=*/hour=*/*.parquet" if found else None


def quarantine_glob(output: Path) -> str | None:
    folder = output / "_quarantine"
    found = any(folder.glob("**/*.parquet"))
    return f"{glob_escaped(folder)}/**/*.parquet" if found else None


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class Samples:
    """The exported samples of a family: Parquet glob, sensor columns, event-time column."""

    glob: str
    sensors: tuple[str, ...]
    time: str
    ns_per_unit: int


def duplicate_samples(samples: Samples) -> tuple[int, list[tuple]]:
    """(number of duplicated (sensor, time) pairs, a few of them)."""
    keys = ", ".join(_ident(c) for c in (*samples.sensors, samples.time))
    sql = (
        f"SELECT {keys}, count(*) AS copies FROM read_parquet(?) GROUP BY ALL "
        f"HAVING count(*) > 1 ORDER BY {keys}"
    )
    with duckdb.connect() as con:
        rows = con.execute(sql, [samples.glob]).fetchall()
    return len(rows), rows[:5]


def sample_gaps(samples: Samples, max_gap_s: float, since_ns: int) -> tuple[int, float, list]:
    """(steps longer than `max_gap_s` ending at or after `since_ns`, the longest step in
    seconds, a few of the gaps)."""
    by, t = ", ".join(_ident(c) for c in samples.sensors), _ident(samples.time)
    sql = f"""
        WITH steps AS (
            SELECT {by}, {t} AS t, ({t} - lag({t}) OVER (PARTITION BY {by} ORDER BY {t}))
                   * {samples.ns_per_unit} / {NS} AS step_s
            FROM read_parquet(?)
        )
        SELECT {by}, t, step_s FROM steps
        WHERE step_s IS NOT NULL AND t * {samples.ns_per_unit} >= ? ORDER BY step_s DESC
    """
    with duckdb.connect() as con:
        rows = con.execute(sql, [samples.glob, since_ns]).fetchall()
    longest = float(rows[0][-1]) if rows else 0.0
    gaps = [r for r in rows if r[-1] > max_gap_s]
    return len(gaps), longest, gaps[:5]


def quarantine_share(output: Path) -> tuple[int, int]:
    """(events quarantined, events exported or quarantined) over the whole export."""
    good, bad = parquet_glob(output), quarantine_glob(output)
    with duckdb.connect() as con:
        exported = 0
        if good:
            sql = "SELECT count(*) FROM (SELECT DISTINCT _segment, _offset FROM read_parquet(?))"
            exported = con.execute(sql, [good]).fetchone()[0]
        refused = (
            con.execute("SELECT count(*) FROM read_parquet(?)", [bad]).fetchone()[0] if bad else 0
        )
    return int(refused), int(exported + refused)


def latest_window_start(instance: dg.DagsterInstance, key: dg.AssetKey) -> int:
    """Event time (ns) from which the latest export run wrote rows (0: check everything)."""
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return 0
    value = event.asset_materialization.metadata.get("min_event_time_ns")
    return int(value.value) if value is not None else 0


def export_checks(
    family: StreamFamily, jobs: FamilyJobs, limits: ChecksTable
) -> dg.AssetChecksDefinition:
    """The checks of `<family>/parquet_export`."""
    from pipeline.schemas import flatten_plan

    key, output = export_key(family, "parquet"), jobs.export.output
    time = flatten_plan(family.schema).time
    sensors = ", ".join((*family.sensor_columns, time.name if time else "its event time"))
    specs = [
        dg.AssetCheckSpec(
            "no_duplicate_samples",
            asset=key,
            blocking=True,
            description=f"Blocking: no two exported rows share ({sensors}). The export is "
            "exactly-once, so a duplicate would be counted twice by every analysis.",
        ),
        dg.AssetCheckSpec(
            "quarantine_rate",
            asset=key,
            blocking=True,
            description="Blocking: the share of events refused into the quarantine table, over "
            f"the whole export, stays at most {limits.quarantine_rate_max:g} ([checks] "
            "quarantine_rate_max); more means the schema or the collectors are wrong.",
        ),
        dg.AssetCheckSpec(
            "no_sample_gaps",
            asset=key,
            description="Warning: in the time range the latest export run wrote, no step "
            f"between two samples of one sensor is longer than {family.max_sample_gap_seconds:g}"
            " s: a longer one is data missing at the edge (a collector down).",
        ),
    ]

    def samples() -> Samples | str:
        glob = parquet_glob(output)
        if glob is None:
            return "no exported rows yet"
        if time is None:
            return f"{family.schema} has no event-time column"
        return Samples(glob, family.sensor_columns, time.name, time.ns_per_unit)

    @dg.multi_asset_check(specs=specs, name=export_checks_op(family), can_subset=True)
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        selected = {k.name for k in context.selected_asset_check_keys}
        found = samples()
        if "no_duplicate_samples" in selected:
            yield duplicates_result(key, found)
        if "quarantine_rate" in selected:
            yield quarantine_result(key, output, limits.quarantine_rate_max)
        if "no_sample_gaps" in selected:
            since = latest_window_start(context.instance, key)
            yield gaps_result(key, found, family.max_sample_gap_seconds, since)

    return _checks


def skipped_result(key: dg.AssetKey, name: str, why: str) -> dg.AssetCheckResult:
    """Nothing to check yet: passed, saying why."""
    return dg.AssetCheckResult(
        asset_key=key, check_name=name, passed=True, metadata={"note": dg.MetadataValue.text(why)}
    )


def duplicates_result(key: dg.AssetKey, samples: Samples | str) -> dg.AssetCheckResult:
    if isinstance(samples, str):
        return skipped_result(key, "no_duplicate_samples", samples)
    count, examples = duplicate_samples(samples)
    return dg.AssetCheckResult(
        asset_key=key,
        check_name="no_duplicate_samples",
        passed=count == 0,
        metadata={
            "duplicated_samples": dg.MetadataValue.int(count),
            "examples": dg.MetadataValue.text(repr(examples)),
            "sensor_columns": dg.MetadataValue.text(", ".join(samples.sensors)),
        },
    )


def quarantine_result(key: dg.AssetKey, output: Path, max_rate: float) -> dg.AssetCheckResult:
    refused, total = quarantine_share(output)
    rate = refused / total if total else 0.0
    return dg.AssetCheckResult(
        asset_key=key,
        check_name="quarantine_rate",
        passed=rate <= max_rate,
        metadata={
            "quarantined": dg.MetadataValue.int(refused),
            "events": dg.MetadataValue.int(total),
            "rate": dg.MetadataValue.float(rate),
            "max_rate": dg.MetadataValue.float(max_rate),
        },
    )


def gaps_result(
    key: dg.AssetKey, samples: Samples | str, max_gap: float, since_ns: int
) -> dg.AssetCheckResult:
    if isinstance(samples, str):
        return skipped_result(key, "no_sample_gaps", samples)
    count, longest, examples = sample_gaps(samples, max_gap, since_ns)
    return dg.AssetCheckResult(
        asset_key=key,
        check_name="no_sample_gaps",
        passed=count == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "gaps": dg.MetadataValue.int(count),
            "longest_step_seconds": dg.MetadataValue.float(longest),
            "max_gap_seconds": dg.MetadataValue.float(max_gap),
            "examples": dg.MetadataValue.text(repr(examples)),
        },
    )


def mirror_lag_check(
    family: StreamFamily, jobs: FamilyJobs, limits: ChecksTable
) -> dg.AssetChecksDefinition:
    """`mirror_lag`: the mirror's committed position against the edge tail, now."""
    checkpoint = jobs.checkpoint("mirror")

    description = (
        f"Warning: the mirror's committed position is at most {limits.mirror_lag_max_bytes} "
        f"bytes ([checks] mirror_lag_max_bytes) behind the tail of {family.stream}, now."
    )

    @dg.asset_check(asset=mirror_key(family), name="mirror_lag", description=description)
    def _lag(stores: StreamStoresResource) -> dg.AssetCheckResult:
        store = stores.open(family.store)
        if not store.stream_exists(family.stream):
            why = f"{family.stream} does not exist yet: nothing to mirror"
            return skipped_result(mirror_key(family), "mirror_lag", why)
        tail, progress = store.tail(family.stream), committed_progress(checkpoint)
        position = progress.end_cut if progress else store.head(family.stream)
        lag = position.bytes_until(tail)
        return dg.AssetCheckResult(
            passed=lag <= limits.mirror_lag_max_bytes,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "lag_bytes": dg.MetadataValue.int(lag),
                "max_lag_bytes": dg.MetadataValue.int(limits.mirror_lag_max_bytes),
                "edge_tail": dg.MetadataValue.text(tail.text),
                "mirror_position": dg.MetadataValue.text(
                    progress.end_cut.text if progress else "nothing mirrored yet"
                ),
            },
        )

    return _lag
