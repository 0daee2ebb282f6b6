"""The slices of a family: the bookmark job over the cloud mirror, as a catch-up asset.

`<family>/slices` runs the bookmark job (`pipeline/jobs/bookmark.py`) until caught up with the
mirror, on the checkpoint of `sluice run bookmark … --continuous` (`assets/catch_up.py` makes
the asset, as it makes the mirror's). The slices sensor turns each new slice into a partition
of the family's replay assets.

Delivery: exactly-once slices (the bookmark job's state is saved per batch and slice ids are
deterministic, so a re-run batch re-records nothing).
"""

from collections.abc import Iterator

import dagster as dg

from assets.catch_up import CatchUpStep, Source, StepRun, service_command, spark_asset_spec
from assets.keys import mirror_key, slices_key
from pipeline.jobs.bookmark import BookmarkSpec, Condition, bookmark, bookmark_checkpoint, threshold
from pipeline.jobs.slices import SliceRecord, format_ns, list_slices
from pipeline.settings import BookmarkTable, StreamFamily
from pipeline.streams import StreamStore

LISTED_SLICES = 20


def conditions(table: BookmarkTable) -> tuple[Condition, ...]:
    found = [threshold("below", text) for text in table.below]
    found += [threshold("above", text) for text in table.above]
    if table.burst_mbps is not None:
        found.append(Condition("burst", value=table.burst_mbps))
    found += [Condition("predicate", predicate=name) for name in table.predicate]
    return tuple(found)


def bookmark_spec(family: StreamFamily) -> BookmarkSpec:
    """The bookmark job of `family`, over its cloud mirror."""
    table = family.bookmark
    assert table is not None, "only families with [streams.NAME.bookmark] have slices"
    return BookmarkSpec(
        stream=family.mirror_stream,
        schema=family.schema,
        store=family.mirror_store_uri,
        conditions=conditions(table),
        sensor_by=table.sensor_by,
        slices_stream=table.slices_stream,
        name=f"bookmark {family.name}",
        min_samples=table.min_samples,
    )


def slices_table(records: list[SliceRecord]) -> dg.MetadataValue:
    """The latest slices as a Markdown table."""
    lines = ["| slice | sensor | from | to | reason |", "|---|---|---|---|---|"]
    for r in records[-LISTED_SLICES:]:
        start, end = format_ns(r.start_time_ns), format_ns(r.end_time_ns)
        lines.append(f"| `{r.slice_id}` | {r.sensor or '*'} | {start} | {end} | {r.reason} |")
    return dg.MetadataValue.md("\n".join(lines))


def slices_step(family: StreamFamily) -> CatchUpStep[frozenset[str]]:
    """`<family>/slices`: slices bookmarked over the family's cloud mirror."""
    spec = bookmark_spec(family)
    assert family.bookmark is not None  # bookmark_spec refuses a family without one
    service = service_command(spec)
    description = (
        f"Slices of {family.mirror_stream} where {spec.reason} (per sensor: "
        f"{spec.sensor_by}), recorded in {spec.slices_stream}. Each slice is a partition of "
        f"the family's replays. Service: `{service}`"
    )
    asset = spark_asset_spec(
        slices_key(family),
        family,
        deps=[mirror_key(family)],
        kind="sluice",
        description=description,
        metadata={"slices_stream": spec.slices_stream, "service_command": service},
    )

    def recorded(store: StreamStore) -> frozenset[str]:
        return frozenset(r.slice_id for r in list_slices(store, spec.stream, spec.slices_stream))

    def results(run: StepRun[frozenset[str]]) -> Iterator[dg.MaterializeResult]:
        records = list_slices(run.store, spec.stream, spec.slices_stream)
        new = sum(r.slice_id not in run.before for r in records)
        metadata = {
            **run.metadata,
            "slices": dg.MetadataValue.int(len(records)),
            "new_slices": dg.MetadataValue.int(new),
            "dagster/row_count": dg.MetadataValue.int(len(records)),
            "latest_slices": slices_table(records),
        }
        yield dg.MaterializeResult(asset_key=asset.key, metadata=metadata)

    return CatchUpStep(
        job="bookmark",
        family=family,
        specs=(asset,),
        description=description,
        checkpoint=bookmark_checkpoint(spec),
        service=service,
        source=Source(family.mirror_store, spec.stream),
        run=lambda spark, options, report: bookmark(spark, spec, options, report),
        results=results,
        before=recorded,
    )
