"""The code location loads from the repository root with no setup, as `dagster dev` loads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from tests.assets.conftest import REPO

DAGSTER = Path(sys.executable).with_name("dagster")


def validate(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster-home"), **env}
    (tmp_path / "dagster-home").mkdir(exist_ok=True)
    return subprocess.run(
        [str(DAGSTER), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_workspace_validates(tmp_path):
    done = validate(tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "All code locations passed validation" in done.stderr + done.stdout


def test_a_broken_config_fails_validation_with_its_reason(tmp_path):
    bad = tmp_path / "sluice.toml"
    bad.write_text('[streams.net]\nstream = "a/b"\nschema = "S"\nflavour = 1\n')
    done = validate(tmp_path, SLUICE_CONFIG=str(bad))
    assert done.returncode != 0
    assert "unknown field `flavour`" in done.stderr + done.stdout


def test_one_asset_family_per_configured_stream(settings):
    from assets.definitions import build_definitions

    defs = build_definitions(settings)
    keys = {key.to_user_string() for key in defs.resolve_all_asset_keys()}
    for family in ("network", "generator"):
        assert f"{family}/edge_stream" in keys


def test_the_spark_resource_takes_the_spark_settings(settings, monkeypatch):
    """`[spark]` of sluice.toml and `SLUICE_SPARK_*` reach the resource, without a session
    (the docker deployment names the code server as the driver host, for the workers)."""
    from assets.definitions import build_resources

    monkeypatch.delenv("SLUICE_SPARK_MASTER", raising=False)
    monkeypatch.setenv("SLUICE_SPARK_DRIVER_HOST", "sluice-code")
    spark = build_resources(settings)["spark"]
    assert (spark.master, spark.driver_host, spark.app_name) == (
        "local[2]",
        "sluice-code",
        "sluice-dagster",
    )
    assert spark.settings().driver_host == "sluice-code"


def test_the_names_the_deployment_relies_on(settings):
    """Steps, pools and run tags are configuration of the instance and its history: a change
    of code structure must not rename them."""
    from assets.definitions import build_definitions

    defs = build_definitions(settings)
    catch_up = defs.resolve_job_def("catch_up_network")
    pools = {node.name: node.definition.pool for node in catch_up.graph.nodes}
    assert pools["network__cloud_mirror"] == "sluice_mirror_network"
    assert pools["export_network"] == "sluice_export_network"
    assert pools["network__slices"] == "sluice_bookmark_network"
    assert catch_up.tags["sluice/exclusive"] == "catch_up/network"
    refresh = defs.resolve_job_def("refresh_analytics")
    assert [n.definition.pool for n in refresh.graph.nodes] == ["sluice_analytics"]
    sensors = {sensor.name for sensor in defs.sensors}
    assert {"edge_tail_sensor", "new_slices_sensor", "streaming_service_progress"} <= sensors


def test_checks_and_columns_are_described(settings):
    """Every check says what it guards; every exported column says what it holds (the Avro
    field's `doc`, the lineage columns' own), before any run and after one."""
    from assets.definitions import build_definitions

    defs = build_definitions(settings)
    graph = defs.resolve_asset_graph()
    checks = {key.name: graph.get_check_spec(key) for key in graph.asset_check_keys}
    mine = ("no_sample_gaps", "no_duplicate_samples", "quarantine_rate", "mirror_lag")
    assert all(checks[name].description for name in mine)
    for family in ("network", "generator"):
        for fmt in ("parquet", "csv"):
            spec = graph.get(dg.AssetKey([family, f"{fmt}_export"]))
            columns = spec.metadata["dagster/column_schema"].columns
            assert {"_segment", "_offset", "_sample"} <= {c.name for c in columns}
            assert all(c.description for c in columns), family
