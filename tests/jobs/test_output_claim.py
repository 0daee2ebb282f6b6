"""One output directory, one checkpoint, also while the output is still empty: the claim a
checkpoint makes before its first batch. Before it, two checkpoints that had published nothing
both went on into one directory, and their batches published files of the same names."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.jobs import output_claim
from pipeline.jobs.output_claim import CLAIM_FILE, OutputClaimed
from pipeline.jobs.stream_join import claim_output as claim_join_output
from tests.jobs.test_export import network, run_export  # noqa: F401
from tests.jobs.test_export_paths import parquet_count
from tests.jobs.test_stream_join import spec_for


def test_a_claim_is_kept_by_its_checkpoint_and_refused_to_another(tmp_path):
    out, mine, other = tmp_path / "out", tmp_path / "cp-a", tmp_path / "cp-b"
    mine.mkdir()
    other.mkdir()
    output_claim.claim("export", out, mine)
    output_claim.claim("export", out, mine)  # again: its own
    (tmp_path / "link").symlink_to(out)
    output_claim.claim("export", tmp_path / "link", mine)  # by another name: the same claim
    with pytest.raises(OutputClaimed, match=f"is written by the checkpoint {mine}"):
        output_claim.claim("export", tmp_path / "link", other)
    assert json.loads((out / CLAIM_FILE).read_text()) == {"job": "export", "checkpoint": str(mine)}


def test_a_claim_whose_checkpoint_is_gone_passes_to_the_next(tmp_path):
    out, gone, other = tmp_path / "out", tmp_path / "cp-a", tmp_path / "cp-b"
    other.mkdir()
    output_claim.claim("export", out, gone)  # (never made, or deleted since)
    output_claim.claim("export", out, other)
    assert output_claim.read_claim(out) == str(other)


def _claim(out: str, checkpoint: str, start, results) -> None:
    start.wait()
    try:
        output_claim.claim("export", Path(out), Path(checkpoint))
    except OutputClaimed:
        results.put("refused")
    else:
        results.put(checkpoint)


def test_of_runs_that_start_at_once_one_claims_the_output(tmp_path):
    checkpoints = [tmp_path / f"cp-{n}" for n in range(6)]
    for checkpoint in checkpoints:
        checkpoint.mkdir()
    start, results = mp.Barrier(len(checkpoints)), mp.Queue()
    args = [(str(tmp_path / "out"), str(cp), start, results) for cp in checkpoints]
    procs = [mp.Process(target=_claim, args=a) for a in args]
    for proc in procs:
        proc.start()
    outcomes = sorted(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(60)
    winners = [o for o in outcomes if o != "refused"]
    assert len(winners) == 1 and outcomes.count("refused") == len(procs) - 1
    assert output_claim.read_claim(tmp_path / "out") == winners[0]


def test_a_join_checkpoint_is_refused_an_empty_output_another_claimed(store_dir, tmp_path):
    spec = spec_for(store_dir, tmp_path / "joined")
    (tmp_path / "cp-a").mkdir()
    (tmp_path / "cp-b").mkdir()
    claim_join_output(tmp_path / "cp-a" / "join", spec)
    with pytest.raises(OutputClaimed, match=r"join output .* is written by the checkpoint"):
        claim_join_output(tmp_path / "cp-b" / "join", spec)
    assert not (tmp_path / "cp-b" / "join" / "parameters.json").exists()
    claim_join_output(tmp_path / "cp-a" / "join", spec)  # its own goes on


@pytest.mark.spark
def test_an_export_is_refused_an_empty_output_another_checkpoint_claimed(
    spark,
    network,  # noqa: F811
    tmp_path,
    capsys,
):
    """The first export's stream is still empty: it published nothing, and the output holds
    no file that says it is taken. The second (another stream) is refused all the same, until
    the first one's checkpoint is deleted."""
    network.store.create_stream("edge/quiet", segments=1)
    out = tmp_path / "out"
    argv = ["--store", f"embedded:{network.store_dir}", "run", "export", "--stream"]
    rest = ["--schema", "NetworkSamples", "--output", str(out)]
    assert cli.main([*argv, "edge/quiet", *rest]) == 0
    quiet = json.loads(capsys.readouterr().out)
    assert quiet["events"] == 0

    assert cli.main([*argv, "edge/network", *rest]) == 1
    err = capsys.readouterr().err
    said = f"export output {out} is written by the checkpoint {quiet['checkpoint']}"
    assert said in err and "Traceback" not in err, err
    assert parquet_count(out) == 0

    shutil.rmtree(quiet["checkpoint"])
    summary = run_export(capsys, network, out)
    assert parquet_count(out) == network.samples
    assert output_claim.read_claim(out) == summary["checkpoint"]
