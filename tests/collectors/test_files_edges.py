"""Files driver at its edges: clock steps, odd CSV content, huge rows, unreadable files, and
the settings that must be refused at start-up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from collectors.errors import ConfigError, DriverError
from collectors.service import create_driver
from collectors.tabular import BadFile, TableFormat, rows, validate
from tests.permissions import without_dac_override

from .conftest import REPO, wait_for
from .test_files import csv_file, files_config, rows_in, settle

CSV = TableFormat("csv", None, "ns")


def test_a_file_with_an_mtime_ahead_of_the_clock_settles_by_not_changing(
    make_config, service, store_dir, dirs
):
    """After the wall clock steps back, files written just before have mtimes in the future:
    they are taken once unchanged for settle_ms, not once the clock has caught up."""
    a, _ = dirs
    path = csv_file(a / "ahead.csv", 0, 3)
    ahead = time.time_ns() + 3600 * 1_000_000_000
    os.utime(path, ns=(ahead, ahead))
    running = service(files_config(make_config, [a]))
    wait_for(lambda: len(rows_in(store_dir)) == 3, timeout=20)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == [0, 1, 2]


def test_a_byte_order_mark_is_not_part_of_the_first_column(make_config, service, store_dir, dirs):
    a, _ = dirs
    (a / "bom.csv").write_bytes(b"\xef\xbb\xbfseq,name\r\n1,x\r\n")  # Excel's "CSV UTF-8"
    settle(a / "bom.csv")
    running = service(files_config(make_config, [a], time_column="seq", time_unit="s"))
    wait_for(lambda: len(rows_in(store_dir)) == 1, timeout=20)
    running.stop()
    assert rows_in(store_dir) == [{"seq": 1, "name": "x"}]


def test_only_plain_ascii_numbers_become_numbers(tmp_path):
    path = tmp_path / "n.csv"
    fields = "1_000,\uff11\uff12,1e400,NaN,0x10, 12 ,-1.5e3"  # b: full-width digits
    path.write_text(f"a,b,c,d,e,f,g\n{fields}\n", encoding="utf-8")
    ((row, _),) = list(rows(path, CSV, 0))
    assert row == {
        "a": "1_000",
        "b": "\uff11\uff12",
        "c": "1e400",
        "d": "NaN",
        "e": "0x10",
        "f": 12,
        "g": -1500.0,
    }


def test_a_tab_delimiter_is_accepted(make_config, service, store_dir, dirs):
    a, _ = dirs
    (a / "t.csv").write_text("seq\tname\n1\tx y\n")
    settle(a / "t.csv")
    config = files_config(make_config, [a], delimiter="\t")
    assert config.instances[0].options.table.delimiter == "\t"
    running = service(config)
    wait_for(lambda: len(rows_in(store_dir)) == 1, timeout=20)
    running.stop()
    assert rows_in(store_dir) == [{"seq": 1, "name": "x y"}]


def test_rows_too_large_for_one_event_are_split_and_a_row_too_large_is_refused(
    make_config, service, store_dir, dirs, tmp_path
):
    a, _ = dirs
    wide = a / "01-wide.csv"
    with wide.open("w") as fh:
        fh.write("seq,blob\n")
        fh.writelines(f"{i},{'x' * 100_000}\n" for i in range(150))  # 100 rows: 10 MB
    huge = a / "02-huge.csv"
    blob = ",".join(["\u00e9" * 100_000] * 50)  # one 5 M character row: 10 MB as JSON
    huge.write_text("seq," + ",".join(f"c{i}" for i in range(50)) + "\n0," + blob + "\n")
    settle(wide)
    settle(huge)
    after = csv_file(a / "03-after.csv", 150, 2)
    settle(after)
    failed = tmp_path / "failed"
    config = files_config(make_config, [a], samples_per_event=100, failed_dir=str(failed))
    running = service(config)
    wait_for(lambda: len(rows_in(store_dir)) == 152, timeout=60)
    wait_for((failed / "02-huge.csv.reason.txt").exists, timeout=20)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == list(range(152))
    note = (failed / "02-huge.csv.reason.txt").read_text()
    assert "row 1 is" in note
    assert "over the event limit 8388608" in note


def test_an_unreadable_file_does_not_hold_up_the_others(write_config, store_dir, dirs):
    a, _ = dirs
    for name, first in (("a.csv", 0), ("b.csv", 10), ("c.csv", 20)):
        settle(csv_file(a / name, first, 2))
    (a / "b.csv").chmod(0)
    table = {
        "driver": "files",
        "stream": "lab/files",
        "directories": [str(a)],
        "settle_ms": 100,
        "scan_interval_ms": 50,
    }
    config = write_config({"files": table})
    command = [*without_dac_override(), sys.executable, "-m", "pipeline.cli"]
    process = subprocess.Popen(
        [*command, "collect", "--config", str(config)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(rows_in(store_dir)) == 4, timeout=30)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert [r["seq"] for r in rows_in(store_dir)] == [0, 1, 20, 21]
    assert "cannot read" in err
    assert "b.csv" in err
    assert "Traceback" not in err


def test_not_utf8_names_the_real_byte_and_line(tmp_path):
    path = tmp_path / "late.csv"
    path.write_bytes(b"a,b\n" + b"1,2\n" * 30_000 + "käse,3\n".encode("latin-1"))
    with pytest.raises(BadFile, match=re.escape("at byte 120005, line 30002")):
        validate(path, CSV)


def test_a_line_longer_than_an_event_is_refused(tmp_path):
    path = tmp_path / "one-line.csv"
    path.write_bytes(b"a\n" + b"x," * 5_000_000 + b"\n")
    with pytest.raises(BadFile, match=re.escape("line 2 is longer than 8388608 characters")):
        validate(path, CSV)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"directories": [""]}, "instances.files.directories = [''] has an empty entry"),
        (
            {"delete_completed": True, "completed_dir": "/tmp/done"},
            "is set with delete_completed = true",
        ),
        ({"completed_dir": "{a}"}, "instances.files.completed_dir = '{a}' is one of the"),
        ({"failed_dir": "{a}/"}, "instances.files.failed_dir = '{a}/' is one of the"),
        ({"delimiter": '"'}, "must be one character other than a quote or a line end"),
    ],
)
def test_nonsense_settings_are_refused(make_config, dirs, extra, message):
    a, _ = dirs
    extra = {k: v.format(a=a) if isinstance(v, str) else v for k, v in extra.items()}
    directories = extra.pop("directories", [a])
    with pytest.raises(ConfigError, match=re.escape(message.format(a=a))):
        files_config(make_config, directories, **extra)


def test_folders_are_absolute_and_a_completed_dir_that_is_a_file_is_refused(
    make_config, dirs, tmp_path, monkeypatch
):
    a, _ = dirs
    monkeypatch.chdir(tmp_path)
    options = files_config(make_config, ["in-a"], completed_dir="done").instances[0].options
    assert options.directories == (a,)
    assert options.completed_dir == tmp_path / "done"
    (tmp_path / "done").write_text("a file")
    config = files_config(make_config, [a], completed_dir="done")
    with pytest.raises(DriverError, match=re.escape(f"completed_dir {tmp_path / 'done'} exists")):
        create_driver(config.instances[0])


def test_a_glob_in_directories_is_named_as_such(make_config, dirs, tmp_path):
    config = files_config(make_config, [tmp_path / "in-*"])
    with pytest.raises(DriverError, match=re.escape("patterns are not expanded")):
        create_driver(config.instances[0])


def test_a_commit_holds_a_bounded_number_of_bytes(
    make_config, service, store_dir, dirs, monkeypatch
):
    """A commit's events are held in memory: wide rows made 100 events of up to 8 MiB each
    (800 MB) one commit. Commits now end at `BYTES_PER_COMMIT` (made small here)."""
    from collectors.drivers import files
    from collectors.instance import InstanceContext

    monkeypatch.setattr(files, "BYTES_PER_COMMIT", 1 << 20)
    sizes: list[int] = []
    real_append = InstanceContext.append

    def append(self, events, *args, **kwargs):
        sizes.append(sum(len(e.payload) for e in events))
        return real_append(self, events, *args, **kwargs)

    monkeypatch.setattr(InstanceContext, "append", append)
    a, _ = dirs
    wide = "x" * 100_000  # under the csv module's field limit
    (a / "wide.csv").write_text("seq,blob\n" + "".join(f"{i},{wide}\n" for i in range(40)))
    settle(a / "wide.csv")
    running = service(files_config(make_config, [a], samples_per_event=1))
    wait_for(lambda: len(rows_in(store_dir)) == 40, timeout=30)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == list(range(40))
    assert max(sizes) < (1 << 20) + 110_000, sizes  # at most one event past the limit
