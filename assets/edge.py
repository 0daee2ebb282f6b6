"""The edge stream of a family: an observed asset whose data version is its tail cut.

Collectors, not Dagster, write the edge stream, so it is observed, never materialized: an
observation reads the stream's head and tail cuts and counts, and records the tail cut's text
as the data version. When the tail moves, the version changes and everything downstream
(mirror, exports, slices, replays) shows as stale in the UI until it catches up.
"""

from __future__ import annotations

import warnings

import dagster as dg

from assets.keys import edge_key, observe_edge_op
from pipeline.settings import StreamFamily
from pipeline.streams import StreamInfo, StreamNotFound
from resources.stores import StreamStoresResource


def edge_spec(family: StreamFamily) -> dg.AssetSpec:
    return dg.AssetSpec(
        key=edge_key(family),
        description=f"Stream {family.stream} in store `{family.store}`, written by collectors "
        "at the edge. Observed: its data version is its tail stream cut.",
        group_name=family.name,
        kinds={"sluice"},
        metadata={"stream": family.stream, "store": family.store_uri, "schema": family.schema},
    )


def stream_info_metadata(info: StreamInfo) -> dict[str, dg.MetadataValue]:
    return {
        "head": dg.MetadataValue.text(info.head.text),
        "tail": dg.MetadataValue.text(info.tail.text),
        "events": dg.MetadataValue.int(info.events),
        "bytes": dg.MetadataValue.int(info.bytes),
        "segments": dg.MetadataValue.int(len(info.segments)),
    }


def observe_edge(family: StreamFamily, stores: StreamStoresResource) -> dg.ObserveResult:
    """The edge stream's tail as a data version, with its counts."""
    store = stores.open(family.store)
    try:
        info = store.info(family.stream)
    except StreamNotFound as exc:
        msg = (
            f"{exc} — the edge stream appears when its collector first commits; start one "
            "with `sluice collect` (or `make demo`)"
        )
        raise dg.Failure(description=msg) from exc
    return dg.ObserveResult(
        asset_key=edge_key(family),
        data_version=dg.DataVersion(info.tail.text),
        metadata=stream_info_metadata(info),
    )


def edge_asset(family: StreamFamily) -> dg.AssetsDefinition:
    """The observable edge-stream asset of `family`."""

    def observe(stores: StreamStoresResource) -> dg.ObserveResult:
        return observe_edge(family, stores)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)  # the AssetSpec-based observable API
        decorate = dg.multi_observable_source_asset(
            specs=[edge_spec(family)], name=observe_edge_op(family)
        )
        return decorate(observe)
