"""Replays: one asset per (family, model), one partition per slice, versioned by the model
and its parameters.

`<family>/replay_<model>` reads a slice (its partition key is the slice id) between its two
cuts, runs the model over it (`pipeline.jobs.replay.replay`) and writes results, metrics and
a lineage record under the replay's identity (slice, model, code version, parameters hash:
`ReplayKey`), exactly as `sluice replay` does. Its code version is the model's version plus
its parameters' hash, so a changed model or changed `params` in sluice.toml makes every
replay stale, and the new results go beside the old ones instead of over them; a blocking
check replays the slice again and wants byte-identical files.

Delivery: exactly-once per (slice, model, version, params): a re-run replaces the same files
with the same bytes (`pipeline/jobs/replay/`).
"""

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import AssetExecutionContext

from assets.catch_up import SPARK_RETRY, Column, column_schema, refusing_permanent_errors
from assets.cuts import cut_range_metadata
from assets.keys import replay_key, slice_partitions, slices_key
from pipeline.jobs.replay import (
    Model,
    ReplayResult,
    load_model,
    replay,
)
from pipeline.jobs.slices import SliceRecord, find_slice, format_ns
from pipeline.settings import ModelTable, StreamFamily
from pipeline.wording import counted
from resources.spark import SparkResource
from resources.stores import StreamStoresResource

DETERMINISM_CHECK = "replay_is_deterministic"


def model_metrics(metrics: dict[str, Any]) -> dict[str, dg.MetadataValue]:
    """The model's own numeric metrics, as `metric/<name>` metadata (plotted by the UI)."""
    found: dict[str, dg.MetadataValue] = {}
    for name, value in sorted(metrics.items()):
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        key = f"metric/{name}"
        found[key] = (
            dg.MetadataValue.int(value)
            if isinstance(value, int)
            else dg.MetadataValue.float(float(value))
        )
    return found


def replay_metadata(result: ReplayResult, record: SliceRecord) -> dict[str, Any]:
    lineage, metrics = result.lineage, result.metrics
    schema = [
        Column(name=f.name, type=str(f.type), nullable=f.nullable) for f in result.results.schema
    ]
    return {
        "slice_id": dg.MetadataValue.text(record.slice_id),
        **cut_range_metadata(record.start_cut, record.end_cut),
        "sensor": dg.MetadataValue.text(record.sensor or "*"),
        "slice_window": dg.MetadataValue.text(
            f"{format_ns(record.start_time_ns)} .. {format_ns(record.end_time_ns)}"
        ),
        "input_events": dg.MetadataValue.int(lineage.input_events),
        "input_rows": dg.MetadataValue.int(lineage.input_rows),
        "quarantined": dg.MetadataValue.int(lineage.quarantined_events),
        "output_rows": dg.MetadataValue.int(lineage.output_rows),
        "dagster/row_count": dg.MetadataValue.int(lineage.output_rows),
        "run_id": dg.MetadataValue.text(lineage.run_id),
        "model": dg.MetadataValue.text(lineage.model),
        "model_version": dg.MetadataValue.text(lineage.model_version),
        "params": dg.MetadataValue.json(json.loads(lineage.params)),
        "params_hash": dg.MetadataValue.text(lineage.params_hash),
        "results": dg.MetadataValue.path(lineage.results_path),
        "metrics": dg.MetadataValue.path(lineage.metrics_path),
        "lineage": dg.MetadataValue.path(str(Path(lineage.output_dir) / "lineage.json")),
        "dagster/column_schema": column_schema(schema),
        **model_metrics(metrics.get("model_metrics", {})),
    }


def same_bytes(a: str | Path, b: str | Path) -> bool:
    return Path(a).read_bytes() == Path(b).read_bytes()


def determinism_check(
    key: dg.AssetKey, first: ReplayResult, again: ReplayResult
) -> dg.AssetCheckResult:
    """The second replay of the slice must write byte-identical results and metrics."""
    results_equal = same_bytes(first.lineage.results_path, again.lineage.results_path)
    metrics_equal = same_bytes(first.lineage.metrics_path, again.lineage.metrics_path)
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=DETERMINISM_CHECK,
        passed=results_equal and metrics_equal,
        metadata={
            "input_events": dg.MetadataValue.int(first.lineage.input_events),
            "input_events_again": dg.MetadataValue.int(again.lineage.input_events),
            "output_rows": dg.MetadataValue.int(first.lineage.output_rows),
            "output_rows_again": dg.MetadataValue.int(again.lineage.output_rows),
            "results_identical": dg.MetadataValue.bool(results_equal),
            "metrics_identical": dg.MetadataValue.bool(metrics_equal),
        },
    )


def code_version(model: Model) -> str:
    """The asset's code version: the model's version and its parameters (short hash)."""
    return f"{model.version}+params-{model.params_hash.removeprefix('sha256:')[:16]}"


def replay_asset(
    family: StreamFamily,
    model_name: str,
    model_table: ModelTable,
    home: Path,
) -> dg.AssetsDefinition:
    """`<family>/replay_<model>`: the model's results over each slice of the family."""
    table = family.bookmark
    assert table is not None, "replays need slices: settings refuse models without a bookmark"
    model: Model = load_model(model_table.function, model_table.params)
    key = replay_key(family, model_name)

    @dg.asset(
        key=key,
        deps=[slices_key(family)],
        partitions_def=slice_partitions(family),
        group_name=family.name,
        kinds={"spark", "pandas"},
        retry_policy=SPARK_RETRY,
        code_version=code_version(model),
        check_specs=[
            dg.AssetCheckSpec(
                DETERMINISM_CHECK,
                asset=key,
                blocking=True,
                description="A second read of the slice through the model gives the same "
                "results as the files written.",
            )
        ],
        description=f"{model.spec} (version {model.version}, parameters {model.params_text}) "
        f"over each slice of {family.mirror_stream}: results, metrics and lineage under "
        "$SLUICE_HOME/replays/<slice>/<model>@<version>/params-<hash>.",
        metadata={
            "model": model.spec,
            "model_version": model.version,
            "params_hash": model.params_hash,
        },
    )
    def _replay(
        context: AssetExecutionContext, spark: SparkResource, stores: StreamStoresResource
    ) -> Iterator[Any]:
        from pipeline.schemas import flatten_plan

        with refusing_permanent_errors():
            store = stores.open(family.mirror_store)
            slice_id = context.partition_key
            plan = flatten_plan(family.schema)
            record = find_slice(store, slice_id, table.slices_stream)
            result = replay(
                spark.session,
                store,
                slice_id,
                model,
                plan=plan,
                home=home,
                slices_stream=table.slices_stream,
            )
            context.log.info(
                f"replayed {slice_id}: {counted(result.lineage.input_rows, 'row')} -> "
                f"{counted(result.lineage.output_rows, 'result')} ({model.spec} {model.version})"
            )
            yield dg.MaterializeResult(metadata=replay_metadata(result, record))
            with tempfile.TemporaryDirectory(prefix="sluice-replay-check-") as scratch:
                again = replay(
                    spark.session,
                    store,
                    slice_id,
                    model,
                    plan=plan,
                    home=Path(scratch),  # its lineage record stays out of the real home
                    output_dir=Path(scratch) / "out",
                    slices_stream=table.slices_stream,
                )
                yield determinism_check(key, result, again)

    return _replay
