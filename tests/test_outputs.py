"""Outputs that cannot be written (`pipeline/outputs.py`): a regular file in the way, a
read-only or full filesystem is one line naming the path and what to do, before any work;
a disk that fills while writing is the same error. Real filesystems: a path under a regular
file, a 1 MiB tmpfs (`small_disk`). The jobs' own refusals: `tests/jobs/test_output_refused.py`."""

from __future__ import annotations

import errno
import os
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.outputs import OutputNotWritable, check_writable, refused_writes


@pytest.fixture
def afile(tmp_path):
    """A regular file where a directory would have to be."""
    path = tmp_path / "afile"
    path.write_text("in the way\n")
    return path


def test_a_regular_file_in_the_way_is_named(afile):
    expected = (
        f"output directory {afile}/out/deeper: {afile} is a regular file, not a directory; "
        "choose another output directory, or move that file away"
    )
    with pytest.raises(OutputNotWritable, match=re.escape(expected)):
        check_writable(afile / "out" / "deeper")
    with pytest.raises(OutputNotWritable, match=re.escape(f"{afile}: it is a regular file")):
        check_writable(afile)
    check_writable(afile, "output file", file=True)  # a file to replace: fine


def test_a_read_only_filesystem_is_named(small_disk):
    small_disk.read_only()
    expected = (
        f"output directory {small_disk.path}/out: {small_disk.path} is on a read-only "
        "filesystem; choose another output directory, or make it writable"
    )
    with pytest.raises(OutputNotWritable, match=re.escape(expected)):
        check_writable(small_disk.path / "out")


def test_a_full_filesystem_says_to_free_space(small_disk):
    small_disk.fill()
    expected = (
        f"output directory {small_disk.path}: no space left on its filesystem; free space on "
        "its filesystem and run again"
    )
    with pytest.raises(OutputNotWritable, match=re.escape(expected)):
        check_writable(small_disk.path)
    small_disk.free()
    check_writable(small_disk.path)
    assert sorted(p.name for p in small_disk.path.iterdir()) == [], "the probe is removed"


def test_a_disk_that_fills_while_writing_names_the_output(small_disk):
    """pyarrow's error names no path ("Error writing bytes to file"): the output is named."""
    table = pa.table({"x": pa.array([os.urandom(1000) for _ in range(1000)])})
    small_disk.fill(leave=64 << 10)
    with (
        pytest.raises(OutputNotWritable) as refused,
        refused_writes(small_disk.path, "the job is exactly-once"),
    ):
        pq.write_table(table, small_disk.path / "part.parquet", compression="none")
    assert str(refused.value) == (
        f"output directory {small_disk.path}: no space left on its filesystem; free space on "
        "its filesystem and run again: the job is exactly-once"
    )
    restored = pickle.loads(pickle.dumps(refused.value))  # Spark ships it between processes
    assert (str(restored), restored.path) == (str(refused.value), str(small_disk.path))


def test_other_errors_pass_as_they_are(tmp_path):
    with pytest.raises(FileNotFoundError), refused_writes(tmp_path, "again"):
        (tmp_path / "missing" / "file").read_text()
    with pytest.raises(OSError, match="Too many") as raised, refused_writes(tmp_path, "again"):
        raise OSError(errno.EMFILE, "Too many open files")
    assert not isinstance(raised.value, OutputNotWritable)


@pytest.fixture
def series(tmp_path):
    left, right = tmp_path / "left.parquet", tmp_path / "right.parquet"
    pq.write_table(pa.table({"time": [1.0, 2.0, 3.0], "v": [1, 2, 3]}), left)
    pq.write_table(pa.table({"time": [1.5, 2.5], "w": [1, 2]}), right)
    return left, right


def test_sluice_join_refuses_an_output_under_a_file(series, afile, capsys):
    """It said "it cannot be written (File exists)" after reading and joining both inputs."""
    output = afile / "pairs.parquet"
    assert cli.main(["join", *map(str, series), "-o", str(output)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"sluice: error: output file {output}: {afile} is a regular file, not a directory; "
        "choose another output file, or move that file away"
    ]


def test_sluice_join_on_a_full_disk_says_to_free_space(series, small_disk, capsys):
    output = small_disk.path / "pairs.parquet"
    small_disk.fill()
    assert cli.main(["join", *map(str, series), "-o", str(output)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"sluice: error: output file {output}: no space left on the filesystem of "
        f"{small_disk.path}; free space on its filesystem and run again"
    ]
    small_disk.free()
    assert cli.main(["join", *map(str, series), "-o", str(output)]) == 0
    assert pq.read_table(output).num_rows > 0


def test_plot_refuses_an_output_under_a_file_before_any_query(afile, capsys):
    output = afile / "rates.png"
    assert cli.main(["plot", "rates", "examples/network", "-o", str(output)]) == 1
    said = capsys.readouterr().err.splitlines()
    assert said == [f"sluice: error: output file {output}: {afile} is a regular file, not a "
                    "directory; choose another output file, or move that file away"]  # fmt: skip


def test_a_directory_that_takes_no_files_is_named():
    """/proc exists but takes no new file (the probe met ENOENT, and the job a traceback)."""
    with pytest.raises(OutputNotWritable, match=re.escape("/proc takes no new files")):
        check_writable(Path("/proc/sluice-output"))
