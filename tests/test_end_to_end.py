"""Collector → mirror → export, end to end, as processes, the way an operator runs them.

A generator collector sends a known sequence of samples into an edge stream, `sluice run
mirror` copies it into a cloud stream, `sluice run export` flattens that into Parquet, and
DuckDB finds every sample exactly once; a second mirror and export find nothing new. Two
backends: `pravega`, on the cluster SLUICE_TEST_PRAVEGA=tcp://host:9090 names (see
docker/README.md), where the collector uses the commit-first protocol and the mirror the
driver-written sink, as Pravega's client cannot flush a transaction; and
`embedded-pravega-protocols`, the embedded store with exactly those protocols forced, so that
every step runs on every machine."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import duckdb
import pytest

from pipeline.streams import open_store
from tests.collectors.conftest import toml_text
from tests.pravega import pravega_backend, pravega_uri
from tests.spark.killing import job_env, run_to_completion

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(900)]

SAMPLES = 20_000
PER_EVENT = 250

BACKENDS = ["embedded-pravega-protocols", pravega_backend("the end-to-end run")]


@pytest.fixture(params=BACKENDS)
def store_uri(request, tmp_path) -> str:
    if request.param == "pravega":
        return pravega_uri()
    return f"embedded:{tmp_path / 'streams'}"


def collect(store_uri: str, edge: str, tmp_path: Path, env: dict[str, str]) -> None:
    """Run a generator collector until it has sent SAMPLES samples (it then drains and exits)."""
    instance = {
        "driver": "generator",
        "stream": edge,
        "samples_per_sec": 200_000,
        "samples_per_event": PER_EVENT,
        "max_samples": SAMPLES,
        "max_events_per_txn": 16,
        "routing_key": "site-1",
        "txn_protocol": "commit",  # what "auto" picks on Pravega
    }
    settings = {"store": store_uri, "state_dir": str(tmp_path / "state")}
    config = tmp_path / "collector.toml"
    config.write_text(toml_text(settings, {"gen": instance}))
    run_to_completion(["collect", "--config", str(config)], env, timeout=300)


def test_collector_mirror_export_exactly_once(store_uri, tmp_path):
    scope = f"e2e{uuid.uuid4().hex[:8]}"
    edge, cloud = f"{scope}/edge", f"{scope}/cloud"
    out = tmp_path / "export"
    env = job_env(tmp_path / "home")

    collect(store_uri, edge, tmp_path, env)
    mirror = ["--store", store_uri, "run", "mirror", "--stream", edge, "--to", cloud]
    mirror += ["--commit-mode", "driver", "--fixed-routing-key", "site-1", "--max-events", "30"]
    mirror += ["--checkpoint", str(tmp_path / "ck-mirror")]
    export = ["--store", store_uri, "run", "export", "--stream", cloud]
    export += ["--schema", "GeneratorSamples", "--output", str(out)]
    export += ["--checkpoint", str(tmp_path / "ck-export")]
    run_to_completion(mirror, env, timeout=300)
    run_to_completion(export, env, timeout=300)

    with open_store(store_uri) as store:
        sent = [e.payload for e in store.read(edge)]
        copied = [e.payload for e in store.read(cloud)]
    assert len(sent) == SAMPLES // PER_EVENT
    assert copied == sent, "the mirror lost, duplicated or reordered an event"
    sequence = [s for p in copied for s in json.loads(p)["Sequence"]]
    assert sequence == list(range(SAMPLES))

    rows = f"read_parquet('{out}/parquet/**/*.parquet', hive_partitioning = true)"
    query = f"SELECT count(*), count(DISTINCT Sequence), min(Sequence), max(Sequence) FROM {rows}"
    assert duckdb.execute(query).fetchone() == (SAMPLES, SAMPLES, 0, SAMPLES - 1)

    # Caught up: a second run of each job publishes nothing new.
    run_to_completion(mirror, env, timeout=300)
    run_to_completion(export, env, timeout=300)
    with open_store(store_uri) as store:
        assert [e.payload for e in store.read(cloud)] == sent
    assert duckdb.execute(query).fetchone() == (SAMPLES, SAMPLES, 0, SAMPLES - 1)
