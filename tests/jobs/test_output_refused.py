"""Where a job writes is checked before Spark starts: a regular file in the way, a read-only
or full filesystem is one line naming the path, exit 1, and nothing is registered (no export
record, no checkpoint). No Spark here; an export whose disk fills while it runs:
`test_export.py`. The check itself: `tests/test_outputs.py`."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from pipeline import cli
from pipeline.cli import run as run_command
from pipeline.config import sluice_home
from pipeline.jobs.slices import record_slices, time_window_slice
from pipeline.jobs.stream_join import SeriesSource, StreamJoinSpec, check_spec, process_batch
from pipeline.outputs import OutputNotWritable
from pipeline.spark import session as spark_session_module
from pipeline.spark.reading import ARROW_SCHEMA
from tests.jobs.test_replay_support import STREAM, T0, nic_payload, nic_stream

IN_THE_WAY = "is a regular file, not a directory; choose another {what}, or move that file away"


@pytest.fixture(autouse=True)
def _no_spark(monkeypatch):
    def no_spark(*_args):
        msg = "Spark was started"
        raise AssertionError(msg)

    monkeypatch.setattr(run_command, "_session", no_spark)
    monkeypatch.setattr(spark_session_module, "spark_session", no_spark)
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "afile"
    path.write_text("in the way\n")
    return path


def refused(capsys, store_dir, argv: list[str]) -> str:
    """The one line `sluice` refuses `argv` with (after its progress lines), once it is
    checked that the refusal registered nothing."""
    assert cli.main(["--store", f"embedded:{store_dir}", *argv]) == 1
    said = capsys.readouterr().err.splitlines()
    assert said[-1].startswith("sluice: error: "), said
    assert not (sluice_home() / "registry").exists(), "the export was registered"
    assert not (sluice_home() / "checkpoints").exists(), "a checkpoint was made"
    return said[-1].removeprefix("sluice: error: ")


EXPORT = ["run", "export", "--stream", STREAM, "--schema", "NetworkSamples"]
JOIN = ["run", "join", "--left", f"{STREAM}#edge1", "--right", f"{STREAM}#edge2"]
JOIN += ["--schema", "NetworkSamples"]


#: case -> (`sluice` argv, the flag naming a path, what the path is)
UNDER_A_FILE = {
    "export --output": (EXPORT, "--output", "output directory"),
    "export --checkpoint": ([*EXPORT, "--output", "out"], "--checkpoint", "checkpoint directory"),
    "join --output": (JOIN, "--output", "output directory"),
    "console --checkpoint": (["run", "console", "--stream", STREAM], "--checkpoint",
                             "checkpoint directory"),
}  # fmt: skip


@pytest.mark.parametrize("case", UNDER_A_FILE)
def test_a_job_refuses_a_path_under_a_regular_file(store, store_dir, afile, capsys, case):
    """The audit's export started Spark (~10 s), printed a wall of Spark errors, ended with
    `NotADirectoryError: …/_staging/…` and had registered the export."""
    argv, flag, what = UNDER_A_FILE[case]
    store.create_stream(STREAM, segments=1)
    target = afile / "out"
    message = refused(capsys, store_dir, [*argv, flag, str(target)])
    assert message == f"{what} {target}: {afile} " + IN_THE_WAY.format(what=what)


#: disk -> what the refusal says after `output directory OUT: `
DISKS = {
    "read-only": "{disk} is on a read-only filesystem; choose another output directory, or "
    "make it writable",
    "full": "no space left on the filesystem of {disk}; free space on its filesystem and run again",
}


@pytest.mark.parametrize("disk", DISKS)
def test_an_export_to_a_disk_that_takes_no_file_is_refused(
    store, store_dir, small_disk, capsys, disk
):
    store.create_stream(STREAM, segments=1)
    if disk == "read-only":
        small_disk.read_only()
    else:
        small_disk.fill()
    out = small_disk.path / "out"
    message = refused(capsys, store_dir, [*EXPORT, "--output", str(out)])
    assert message == f"output directory {out}: " + DISKS[disk].format(disk=small_disk.path)


def test_a_replay_refuses_an_output_under_a_regular_file(store, store_dir, afile, capsys):
    """It started Spark, read the slice, ran the model, then died in a traceback."""
    nic_stream(store, {"edge1": [[100] * 10] * 3})
    record = time_window_slice(store, STREAM, T0, T0 + 3 * 10**9, sensor="edge1")
    record_slices(store, [record])
    target = afile / "replay"
    argv = ["replay", record.slice_id, "--model", "pipeline.models.nic:throughput"]
    message = refused(
        capsys, store_dir, [*argv, "--schema", "NetworkSamples", "--output", str(target)]
    )
    what = "output directory"
    assert message == f"{what} {target}: {afile} " + IN_THE_WAY.format(what=what)


def test_a_join_batch_on_a_full_disk_names_the_output(tmp_path, small_disk):
    """A part file the disk refuses is one line naming the output, and the batch's state is
    not saved: the re-run of the batch writes its pairs."""
    spec = StreamJoinSpec(
        SeriesSource(STREAM, "a"), SeriesSource(STREAM, "b"), "NetworkSamples", "embedded:x",
        small_disk.path / "pairs",
    )  # fmt: skip
    plan = check_spec(spec)
    rows = [
        {"stream": STREAM, "routing_key": key, "segment": 0, "offset": i, "end_offset": i + 1,
         "ingest_time": datetime.fromtimestamp(0, UTC),
         "payload": nic_payload("h", T0 + i * 10**9, 0, list(range(1, 2001)), 1000)}
        for i, key in enumerate(["a", "b"] * 20)
    ]  # fmt: skip
    events = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    small_disk.fill(leave=8 << 10)
    with pytest.raises(OutputNotWritable) as raised:
        process_batch(spec, plan, tmp_path / "state", 0, events)
    assert str(raised.value) == (
        f"output directory {spec.output}: no space left on its filesystem; free space on its "
        "filesystem and run again: the join is exactly-once, so its next run re-runs the "
        "batch and writes its pairs once"
    )
    assert not list((tmp_path / "state").glob("state-*")), "the batch is to run again"
    small_disk.free()
    assert process_batch(spec, plan, tmp_path / "state", 0, events) > 0
