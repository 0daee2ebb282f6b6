"""The Dagster UI in a real browser, checked the way a user checks it: the network stream's
expanded lineage graph (edge stream -> mirror -> exports -> views, slices -> replays), an
export's latest materialization with the counts its run recorded, a replay partition with its
lineage back to stream cuts, a sensor turned on from the UI and ticking under the daemon, and
the cloud mirror materialized from the UI. Screenshots go to test-artifacts/ (dagster-*.png).

The pipeline runs first in this process (one Spark session) on the UI's instance; only the
mirror's materialization runs under the daemon, as a run launched from the UI."""

from __future__ import annotations

import re
from typing import Any

import dagster as dg
import pytest

from assets.definitions import build_definitions, build_resources
from assets.instance import sluice_instance
from assets.sensors import evaluate_slices
from pipeline.settings import SluiceSettings
from tests.assets.conftest import materialized, nic_events, samples, tail_text, write_events
from tests.assets.ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, dagster_ui

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,  # a webserver, a daemon, Chromium and a Spark run under the daemon
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make system-deps)"),
]

RUN_TIMEOUT_MS = 300_000
UI_TIMEOUT_MS = 90_000
QUIET, BURST = 1000, 100_000  # bytes per 0.1 s sample: 0.08 and 8 Mbit/s
#: Sensors tick every 5 s in this UI (the daemon's loop), not every 30 s.
SENSOR_PACE = {"SLUICE_DAGSTER_TAIL_SENSOR_INTERVAL_SECONDS": "5"}
REPLAY_NODE = re.compile(r"^replay_nic_throughput$")
UPSTREAM = "view=lineage&lineageScope=upstream&lineageDepth=3"  # slices, mirror, edge stream


def skip_welcome(page) -> None:
    """Dismiss the community dialog Dagster shows on a fresh instance, if it does."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(timeout=5_000)
    except PlaywrightTimeout:  # the dialog did not show
        return
    skip.click()


def open_page(page, url: str) -> None:
    page.goto(url, wait_until="networkidle", timeout=UI_TIMEOUT_MS)
    skip_welcome(page)


def run_pipeline(settings: SluiceSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """Catch up the network family and replay its first slice, on the UI's instance: the
    parquet export's and the replay's recorded metadata."""
    net = settings.family("network")
    write_events(net.store_uri, net.stream, nic_events([QUIET, BURST, BURST, QUIET, BURST, QUIET]))
    defs, resources = build_definitions(settings), build_resources(settings)
    with sluice_instance(settings) as instance:
        caught_up = defs.resolve_job_def("catch_up_network").execute_in_process(instance=instance)
        context = dg.build_sensor_context(instance=instance, resources=resources)
        decision = evaluate_slices(context, resources["stores"], [net])
        for request in decision.dynamic_partitions_requests or ():
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        first = decision.run_requests[0].partition_key
        replayed = defs.resolve_job_def("replay_network").execute_in_process(
            instance=instance, partition_key=first
        )
    assert caught_up.success and replayed.success
    return (
        materialized(caught_up)["network/parquet_export"],
        materialized(replayed)["network/replay_nic_throughput"],
    )


def metadata_row(page, key: str):
    """The row of the metadata table whose key is `key`."""
    return page.locator("tr").filter(has=page.get_by_text(key, exact=True)).first


def node_box(page, name: str | re.Pattern) -> dict[str, float]:
    node = page.get_by_text(name, exact=True) if isinstance(name, str) else page.get_by_text(name)
    box = node.last.bounding_box()  # the graph's node (the page header may name it first)
    assert box is not None, f"{name} is not on the graph"
    return box


def check_lineage_graph(page, base: str) -> None:
    """The edge stream's downstream lineage, every group expanded: each asset is drawn right
    of the assets it reads (the graph's layers), so the chain reads left to right."""
    from playwright.sync_api import expect

    url = f"{base}/assets/network/edge_stream?view=lineage&lineageScope=downstream&lineageDepth=4"
    open_page(page, url)
    names = ["edge_stream", "cloud_mirror", "parquet_export", "csv_export", "slices"]
    for name in [*names, "duckdb_views"]:
        expect(page.get_by_text(name, exact=True).last).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text(REPLAY_NODE).last).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text("Loading...")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(ARTIFACTS / "dagster-lineage-network.png"))
    x = {name: node_box(page, name)["x"] for name in [*names, "duckdb_views"]}
    x["replay"] = node_box(page, REPLAY_NODE)["x"]
    chains = [
        ("edge_stream", "cloud_mirror", "parquet_export", "duckdb_views"),
        ("cloud_mirror", "csv_export"),
        ("cloud_mirror", "slices", "replay", "duckdb_views"),
    ]
    for chain in chains:
        positions = [x[name] for name in chain]
        assert positions == sorted(positions) and len(set(positions)) == len(chain), (chain, x)


def check_export_page(page, base: str, export: dict[str, Any]) -> None:
    """The parquet export's latest materialization shows what its run recorded."""
    from playwright.sync_api import expect

    open_page(page, f"{base}/assets/network/parquet_export")
    for key in ("rows", "events", "files", "quarantined", "end_cut"):
        row = metadata_row(page, key)
        expect(row).to_contain_text(str(export[key]), timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text("network / cloud_mirror").first).to_be_visible()  # upstream
    expect(page.get_by_text("analytics / duckdb_views").first).to_be_visible()  # downstream
    page.screenshot(path=str(ARTIFACTS / "dagster-parquet-export.png"), full_page=True)
    assert export["rows"] == 60 and export["quarantined"] == 0  # the 6 events' samples


def check_replay_partition(page, base: str, replay: dict[str, Any]) -> None:
    """A replay partition: the slice's cut range, counts and lineage record; upstream, the
    slices, the mirror and the edge stream."""
    from playwright.sync_api import expect

    slice_id = replay["slice_id"]
    url = f"{base}/assets/network/replay_nic_throughput?view=partitions&partition={slice_id}"
    open_page(page, url)
    for key in ("slice_id", "start_cut", "end_cut", "input_rows", "output_rows", "lineage"):
        expect(metadata_row(page, key)).to_contain_text(str(replay[key]), timeout=UI_TIMEOUT_MS)
    assert replay["lineage"].endswith("lineage.json")
    page.screenshot(path=str(ARTIFACTS / "dagster-replay-partition.png"), full_page=True)
    open_page(page, f"{base}/assets/network/replay_nic_throughput?{UPSTREAM}")
    for name in ("slices", "cloud_mirror", "edge_stream"):
        expect(page.get_by_text(name, exact=True).last).to_be_visible(timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(ARTIFACTS / "dagster-replay-lineage.png"))


def check_sensor_ticks(page, base: str, settings: SluiceSettings) -> None:
    """Turn the new-slices sensor on from its page; the daemon ticks it (every 5 s here),
    and the page shows its ticks."""
    from playwright.sync_api import expect

    open_page(page, f"{base}/locations/sluice/sensors/new_slices_sensor")
    running = metadata_row(page, "Running")
    expect(running.get_by_role("checkbox")).to_be_enabled(timeout=UI_TIMEOUT_MS)
    running.locator("label").first.click()
    expect(running.get_by_role("checkbox")).to_be_checked(timeout=UI_TIMEOUT_MS)
    latest = metadata_row(page, "Latest tick")
    expect(latest).not_to_contain_text("never run", timeout=UI_TIMEOUT_MS)
    with sluice_instance(settings) as instance:  # a second tick: it is ticking, not ticked
        deadline_ms, waited = UI_TIMEOUT_MS, 0
        while len(sensor_ticks(instance, "new_slices_sensor")) < 2 and waited < deadline_ms:
            page.wait_for_timeout(2_000)
            waited += 2_000
        ticks = sensor_ticks(instance, "new_slices_sensor")
    assert len(ticks) >= 2
    page.reload(wait_until="networkidle")
    expect(metadata_row(page, "Latest tick")).to_contain_text(
        re.compile("Skipped|Success|Requested", re.I), timeout=UI_TIMEOUT_MS
    )
    page.screenshot(path=str(ARTIFACTS / "dagster-sensor-ticking.png"), full_page=True)
    open_page(page, f"{base}/automation")
    expect(page.get_by_text("new_slices_sensor", exact=True).first).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "dagster-automation.png"), full_page=True)


def sensor_ticks(instance: dg.DagsterInstance, name: str) -> list[Any]:
    for state in instance.all_instigator_state():
        if state.instigator_name == name:
            return list(instance.get_ticks(state.instigator_origin_id, state.selector_id))
    return []


def materialize_the_mirror(page, base: str, end_cut: str) -> None:
    """Materialize the cloud mirror from its page; the run shows the new end cut."""
    from playwright.sync_api import expect

    open_page(page, f"{base}/assets/network/cloud_mirror")
    materialize = page.get_by_role("button", name="Materialize")
    expect(materialize.first).to_be_enabled(timeout=UI_TIMEOUT_MS)
    page.screenshot(path=str(ARTIFACTS / "dagster-cloud-mirror-before.png"))
    materialize.first.click()
    expect(page.get_by_text(re.compile(r"Launched run"))).to_be_visible(timeout=UI_TIMEOUT_MS)
    # The run is queued, launched by the daemon, and starts Spark: poll the asset page.
    metadata_value = page.get_by_text(end_cut, exact=True)
    deadline_ms, waited = RUN_TIMEOUT_MS, 0
    while not metadata_value.count() and waited < deadline_ms:
        page.wait_for_timeout(5_000)
        waited += 5_000
        page.reload(wait_until="networkidle")
    page.screenshot(path=str(ARTIFACTS / "dagster-cloud-mirror-materialized.png"), full_page=True)
    expect(metadata_value.first).to_be_visible()
    expect(metadata_row(page, "start_cut")).to_be_visible()
    assert "Never materialized" not in page.inner_text("body")


def test_the_ui_shows_lineage_materializations_replays_and_ticks(settings, spark, tmp_path):
    from playwright.sync_api import sync_playwright

    export, replay = run_pipeline(settings)
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(5, first_event=6))  # for the UI's run
    end_cut = tail_text(net.store_uri, net.stream)
    ARTIFACTS.mkdir(exist_ok=True)
    logs = tmp_path / "logs"
    with dagster_ui(settings.home, logs, SENSOR_PACE) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1600, "height": 1100})
        check_lineage_graph(page, base)
        check_export_page(page, base, export)
        check_replay_partition(page, base, replay)
        check_sensor_ticks(page, base, settings)
        materialize_the_mirror(page, base, end_cut)
        browser.close()
