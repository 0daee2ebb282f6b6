"""An export whose output was deleted or moved refuses to go on (its checkpoint would never
write those files again); removing some old files, an operator's retention, is fine."""

from __future__ import annotations

import re
import shutil

import pytest

from pipeline import cli
from tests.jobs.test_export import network, parquet_count, run_export  # noqa: F401

pytestmark = pytest.mark.spark


def test_a_moved_output_is_refused_and_a_trimmed_one_goes_on(spark, network, tmp_path, capsys):  # noqa: F811
    out, ck = tmp_path / "out", tmp_path / "ck"
    run_export(capsys, network, out, "--checkpoint", str(ck), "--max-rows-per-file", "300")
    files = sorted(out.glob("parquet/date=*/hour=*/*.parquet"))
    assert len(files) > 2

    files[0].unlink()  # retention: the oldest files removed by hand
    summary = run_export(capsys, network, out, "--checkpoint", str(ck))
    assert summary["events"] == 0

    published = len(files)
    shutil.move(out, tmp_path / "moved-away")
    argv = ["--store", f"embedded:{network.store_dir}", "run", "export", "--stream"]
    argv += ["edge/network", "--schema", "NetworkSamples", "--output", str(out)]
    assert cli.main([*argv, "--checkpoint", str(ck)]) != 0
    err = capsys.readouterr().err
    expected = (
        f"export to {out}: none of the {published} parquet files its checkpoint {ck} "
        "published is there any more (deleted, or the directory moved): move them back, or, "
        f"to export the stream again from its start, delete {out} and that checkpoint"
    )
    assert re.search(re.escape(expected), err), err

    shutil.rmtree(ck)  # as the message says: the export starts over
    run_export(capsys, network, out, "--checkpoint", str(ck))
    assert parquet_count(out) == network.samples
