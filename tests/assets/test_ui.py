"""The Dagster UI in a real browser: open the asset graph, materialize the cloud mirror, see
the run succeed with its cut range on the asset's page. The screenshots are kept under
test-artifacts/ (the asset graph, and the materialized asset with its metadata)."""

from __future__ import annotations

import re

import pytest

from tests.assets.conftest import samples, tail_text, write_events
from tests.assets.ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, dagster_ui

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make system-deps)"),
]

RUN_TIMEOUT_MS = 300_000


def skip_welcome(page) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    """Dismiss the community dialog Dagster shows on a fresh instance, if it does."""
    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(timeout=5_000)
    except PlaywrightTimeout:  # the dialog did not show
        return
    skip.click()


def test_materialize_the_mirror_from_the_ui(settings, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(5))
    end_cut = tail_text(net.store_uri, net.stream)
    ARTIFACTS.mkdir(exist_ok=True)
    with dagster_ui(settings.home, tmp_path / "logs") as base, sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{base}/locations/sluice/asset-groups/network", wait_until="networkidle")
        skip_welcome(page)
        for node in ("edge_stream", "cloud_mirror", "parquet_export", "csv_export"):
            expect(page.get_by_text(node, exact=True).first).to_be_visible(timeout=60_000)
        expect(page.get_by_text("Loading...")).to_have_count(0, timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "dagster-asset-graph.png"))

        page.goto(f"{base}/assets/network/cloud_mirror", wait_until="networkidle")
        skip_welcome(page)
        materialize = page.get_by_role("button", name="Materialize")
        expect(materialize.first).to_be_enabled(timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "dagster-cloud-mirror-before.png"))
        materialize.first.click()
        expect(page.get_by_text(re.compile(r"Launched run"))).to_be_visible(timeout=60_000)
        # The run is queued, launched by the daemon, and starts Spark: poll the asset page.
        metadata_value = page.get_by_text(end_cut, exact=True)
        deadline_ms, waited = RUN_TIMEOUT_MS, 0
        while not metadata_value.count() and waited < deadline_ms:
            page.wait_for_timeout(5_000)
            waited += 5_000
            page.reload(wait_until="networkidle")
        page.screenshot(
            path=str(ARTIFACTS / "dagster-cloud-mirror-materialized.png"), full_page=True
        )
        expect(metadata_value.first).to_be_visible()
        expect(page.get_by_text("end_cut", exact=True).first).to_be_visible()
        expect(page.get_by_text("start_cut", exact=True).first).to_be_visible()
        body = page.inner_text("body")
        assert "Never materialized" not in body
        browser.close()
