"""Two jobs never share a default checkpoint because their names read alike (`/d/out a`,
`/d/out.a`, long names with a common tail), and a default checkpoint named before its name
had a hash is still found, by its own job only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.checkpoint import Checkpoint, JobIdentity, default_checkpoint

T0 = 1_609_362_000_000_000_000


def test_names_that_read_alike_get_their_own_default_checkpoints():
    alike = ["/d/out a", "/d/out[a", "/d/out.a", "d/out a/"]
    roots = {default_checkpoint("export", "edge/n", target) for target in alike}
    assert len(roots) == len(alike)
    tail = "x" * 130
    assert default_checkpoint("export", "edge/n", f"/a/{tail}") != default_checkpoint(
        "export", "edge/n", f"/b/{tail}"
    )
    longest = default_checkpoint("export", "s" * 300, "t" * 300)
    assert len(longest.name) <= 255


def legacy_root(job: str, source: str, target: str) -> Path:
    """Where a default checkpoint was before its name had a hash."""

    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", ".", text.strip("/")).strip(".")[-120:]

    return sluice_home() / "checkpoints" / job / f"{safe(source)}--{safe(target)}"


def test_a_default_checkpoint_named_before_the_hash_is_still_found_but_only_by_its_job():
    old = legacy_root("export", "edge/n", "/d/out a")
    with Checkpoint(old, JobIdentity("export", "embedded:/s#edge/n", "/d/out a")):
        pass
    assert default_checkpoint("export", "edge/n", "/d/out a") == old
    # `/d/out.a` had the same name; that checkpoint is not its own
    assert default_checkpoint("export", "edge/n", "/d/out.a") != old
    mirror_old = legacy_root("mirror", "edge/n", "cloud/n")
    with Checkpoint(mirror_old, JobIdentity("mirror", "embedded:/s#edge/n", "embedded:/c#cloud/n")):
        pass
    assert default_checkpoint("mirror", "edge/n", "cloud/n") == mirror_old
    assert default_checkpoint("mirror", "edge/n", "cloud.n") != mirror_old


def run_cli(capsys, *argv: str) -> dict:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def nic_events(store, n: int = 6) -> None:
    store.create_stream("edge/network", segments=2)
    with store.writer("edge/network") as writer:
        for i in range(n):
            event = {
                "TimestampNanos": [T0 + i * 10**9 + k for k in range(5)],
                "RxBytes": list(range(5)),
                "TxBytes": list(range(5)),
                "RemoteAddr": "ubuntu",
                "Interface": "eth0",
            }
            writer.write(json.dumps(event).encode(), routing_key=f"eth{i % 2}")


@pytest.mark.spark
def test_exports_to_outputs_whose_names_read_alike_keep_their_own_checkpoints(
    spark, store, store_dir, tmp_path, capsys
):
    nic_events(store)
    base = ["--store", f"embedded:{store_dir}", "run", "export", "--stream", "edge/network"]
    base += ["--schema", "NetworkSamples", "--format", "parquet"]
    first = run_cli(capsys, *base, "--output", str(tmp_path / "out a"))
    second = run_cli(capsys, *base, "--output", str(tmp_path / "out.a"))
    assert first["checkpoint"] != second["checkpoint"]
    assert (first["events"], second["events"]) == (6, 6)
    # a checkpoint named the former way goes on where it stopped
    legacy = legacy_root("export", "edge/network", str(tmp_path / "out a"))
    Path(first["checkpoint"]).rename(legacy)
    again = run_cli(capsys, *base, "--output", str(tmp_path / "out a"))
    assert (again["checkpoint"], again["events"]) == (str(legacy), 0)
