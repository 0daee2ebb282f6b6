"""The slices of a family: the bookmark job over the cloud mirror, as a Dagster asset.

`<family>/slices` runs the bookmark job (`pipeline/jobs/bookmark.py`) until caught up with the
mirror, on the checkpoint `sluice run bookmark` uses, so a continuous bookmark service and
Dagster runs share one position (a run that finds the service running skips, as the mirror
does). Each new slice becomes a partition of the family's replay assets: the slices sensor
adds one dynamic partition per slice id (`slice_partitions`) and requests its replays.

Delivery: exactly-once slices (the bookmark job's state is saved per batch and slice ids are
deterministic, so a re-run batch re-records nothing).
"""

import shlex
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster import AssetExecutionContext

from assets.streaming import (
    SPARK_RETRY,
    catch_up,
    mirror_key,
    pool,
    run_metadata,
    skipped_observation,
)
from pipeline.jobs.bookmark import BookmarkSpec, Condition, bookmark, threshold
from pipeline.jobs.checkpoint import default_checkpoint
from pipeline.jobs.slices import SliceRecord, format_ns, list_slices
from pipeline.settings import BookmarkTable, StreamFamily
from resources.spark import SparkResource
from resources.stores import StreamStoresResource

LISTED_SLICES = 20


def slices_key(family: StreamFamily) -> dg.AssetKey:
    return dg.AssetKey([family.name, "slices"])


def slice_partitions(family: StreamFamily) -> dg.DynamicPartitionsDefinition:
    """One partition per slice id of the family (added by the slices sensor)."""
    return dg.DynamicPartitionsDefinition(name=f"{family.name}_slices")


def conditions(table: BookmarkTable) -> tuple[Condition, ...]:
    found = [threshold("below", text) for text in table.below]
    found += [threshold("above", text) for text in table.above]
    if table.burst_mbps is not None:
        found.append(Condition("burst", value=table.burst_mbps))
    found += [Condition("predicate", predicate=name) for name in table.predicate]
    return tuple(found)


def bookmark_spec(family: StreamFamily, cloud_uri: str) -> BookmarkSpec:
    table = family.bookmark
    assert table is not None, "only families with [streams.NAME.bookmark] have slices"
    return BookmarkSpec(
        stream=family.mirror_stream,
        schema=family.schema,
        store=cloud_uri,
        conditions=conditions(table),
        sensor_by=table.sensor_by,
        slices_stream=table.slices_stream,
        name=f"bookmark {family.name}",
    )


def bookmark_service_command(spec: BookmarkSpec) -> str:
    """The `sluice run bookmark … --continuous` command of the service that shares the
    checkpoint."""
    return shlex.join(spec.command_line())


def slices_table(records: list[SliceRecord]) -> dg.MetadataValue:
    """The latest slices as a Markdown table."""
    lines = ["| slice | sensor | from | to | reason |", "|---|---|---|---|---|"]
    for r in records[-LISTED_SLICES:]:
        start, end = format_ns(r.start_time_ns), format_ns(r.end_time_ns)
        lines.append(f"| `{r.slice_id}` | {r.sensor or '*'} | {start} | {end} | {r.reason} |")
    return dg.MetadataValue.md("\n".join(lines))


def slices_asset(family: StreamFamily, cloud_uri: str) -> dg.AssetsDefinition:
    """`<family>/slices`: slices bookmarked over the family's cloud mirror."""
    assert family.bookmark is not None
    spec, key = bookmark_spec(family, cloud_uri), slices_key(family)
    checkpoint = default_checkpoint("bookmark", spec.stream, spec.slices_stream)
    service = bookmark_service_command(spec)

    @dg.asset(
        key=key,
        deps=[mirror_key(family)],
        group_name=family.name,
        kinds={"spark", "sluice"},
        pool=pool("bookmark", family),
        retry_policy=SPARK_RETRY,
        output_required=False,
        description=f"Slices of {family.mirror_stream} where {spec.reason} (per sensor: "
        f"{spec.sensor_by}), recorded in {spec.slices_stream}. Each slice is a partition of "
        f"the family's replays. Service: `{service}`",
        metadata={"slices_stream": spec.slices_stream, "service_command": service},
    )
    def _slices(
        context: AssetExecutionContext, spark: SparkResource, stores: StreamStoresResource
    ) -> Iterator[Any]:
        store = stores.open(family.mirror_store)
        before = {r.slice_id for r in list_slices(store, spec.stream, spec.slices_stream)}
        outcome = catch_up(
            context,
            lambda run, report: bookmark(spark.session, spec, run, report),
            checkpoint,
            service,
        )
        if outcome.skipped:
            yield skipped_observation(key, outcome)
            return
        records = list_slices(store, spec.stream, spec.slices_stream)
        metadata, _ = run_metadata(outcome, checkpoint, store.tail(spec.stream))
        metadata.update(
            {
                "slices": dg.MetadataValue.int(len(records)),
                "new_slices": dg.MetadataValue.int(sum(r.slice_id not in before for r in records)),
                "dagster/row_count": dg.MetadataValue.int(len(records)),
                "latest_slices": slices_table(records),
            }
        )
        yield dg.MaterializeResult(metadata=metadata)

    return _slices
