"""Faults and bad input at the collector's edges (issue 13): each is one typed error, or the
behaviour a user expects, and nothing stored, buffered or given as input is harmed."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collectors.errors import (
    BufferNotWritable,
    BufferOwned,
    BufferUnusable,
    ConfigError,
    DriverError,
)
from collectors.service import run_service
from pipeline.failpoints import Failpoints
from pipeline.streams import StoreUnavailable
from tests.disks import small_disk

from .conftest import buffer_at, read_payloads, run_cli, wait_for
from .test_files import counters, csv_file, files_config, rows_in, settle


def generator(stream: str = "t/h1", **extra) -> dict:
    return {"driver": "generator", "stream": stream, "samples_per_sec": 1000} | extra


def unreachable(uri: str):
    raise StoreUnavailable(uri, "switched off by the test")


def buffer_36_unsent(make_config, tmp_path):
    """Instance g (generator -> t/h1) leaves 36 events in its buffer: the store is down."""
    config = make_config(
        {"g": generator(max_samples=36, samples_per_event=1)}, drain_timeout_seconds=1
    )
    run_service(config, Failpoints(), store_opener=unreachable, install_signals=False)
    buffer_file = config.instances[0].buffer_file
    with buffer_at(buffer_file) as buffer:
        assert buffer.depth() == 36
    return buffer_file


def test_a_store_uri_of_unknown_scheme_is_refused_at_start_up(write_config, tmp_path):
    path = write_config({"g": generator()}, store="ftp://x")
    result = run_cli("collect", "--config", str(path), timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"sluice: error: collector config: {path} [collector]: collector.store = 'ftp://x' "
        "is not a store URI; use embedded:<dir> or pravega://host:9090"
    )
    assert not (tmp_path / "state").exists()  # nothing started, nothing written


def test_an_instance_store_of_unknown_scheme_is_refused(make_config):
    with pytest.raises(ConfigError, match=re.escape("instances.g.store = 'ftp://x' is not a")):
        make_config({"g": generator(store="ftp://x")})


def test_a_buffer_file_under_a_missing_directory_is_refused(make_config, tmp_path):
    missing = tmp_path / "not-mounted" / "g.db"
    config = make_config({"g": generator(buffer_file=str(missing))})
    problem = f"its directory {missing.parent} does not exist; create it, or fix buffer_file"
    with pytest.raises(BufferUnusable, match=re.escape(problem)):
        run_service(config, Failpoints(), install_signals=False)
    assert not missing.parent.exists()


def test_a_buffer_file_that_is_not_sqlite_is_refused_and_kept(make_config, tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 100)
    before = path.read_bytes()
    config = make_config({"g": generator(buffer_file=str(path))})
    with pytest.raises(BufferUnusable, match=re.escape(f"buffer {path}: is not a SQLite database")):
        run_service(config, Failpoints(), install_signals=False)
    assert path.read_bytes() == before
    assert not path.with_name("notes.db-wal").exists()


def test_another_programs_sqlite_file_is_refused_and_kept(make_config, tmp_path):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (name TEXT)")
        conn.execute("INSERT INTO customers VALUES ('ada')")
    conn.close()
    before = path.read_bytes()
    config = make_config({"g": generator(buffer_file=str(path))})
    expected = f"buffer {path}: is another program's SQLite database (tables customers)"
    with pytest.raises(BufferUnusable, match=re.escape(expected)):
        run_service(config, Failpoints(), install_signals=False)
    assert path.read_bytes() == before


def test_a_buffer_of_another_instance_is_refused_naming_both(make_config, tmp_path, store_dir):
    buffer_file = buffer_36_unsent(make_config, tmp_path)
    config = make_config({"h2": generator("t/h2", buffer_file=str(buffer_file))})
    expected = (
        f"instance h2 (stream t/h2): buffer {buffer_file} belongs to instance g (stream t/h1)"
    )
    with pytest.raises(BufferOwned, match=re.escape(expected)):
        run_service(config, Failpoints(), install_signals=False)
    with buffer_at(buffer_file) as buffer:
        assert buffer.depth() == 36
        assert (buffer.meta()["instance"], buffer.meta()["stream"]) == ("g", "t/h1")
    assert read_payloads(store_dir, "t/h2") == []


def test_a_service_left_busy_past_its_drain_timeout_lets_its_buffer_go_once_idle(make_config):
    """Its sender was still in a store call at the deadline: the service returned (as a
    process exits), and the instance kept its buffer's lock in this process for good, so the
    next start here was refused as another running collector (a flaky test before)."""
    release = threading.Event()

    def stuck(uri: str):
        release.wait(30)  # past the drain timeout
        raise StoreUnavailable(uri, "switched off by the test")

    config = make_config(
        {"g": generator(max_samples=36, samples_per_event=1)}, drain_timeout_seconds=1
    )
    run_service(config, Failpoints(), store_opener=stuck, install_signals=False)
    release.set()
    # the same instance starts again here: it gets the buffer once the sender has ended
    run_service(config, Failpoints(), store_opener=unreachable, install_signals=False)
    with buffer_at(config.instances[0].buffer_file) as buffer:
        assert buffer.depth() == 36


def test_the_same_instance_pointed_at_another_stream_keeps_its_buffer(make_config, tmp_path):
    buffer_file = buffer_36_unsent(make_config, tmp_path)
    config = make_config({"g": generator("t/h2")})
    with pytest.raises(BufferOwned, match=re.escape("belongs to instance g (stream t/h1)")):
        run_service(config, Failpoints(), install_signals=False)
    with buffer_at(buffer_file) as buffer:
        assert buffer.depth() == 36


def test_an_empty_buffer_moves_with_its_instance_to_another_stream(make_config, store_dir):
    config = make_config({"g": generator(max_samples=5, samples_per_event=1)})
    run_service(config, Failpoints(), install_signals=False)
    moved = make_config({"g": generator("t/h2", max_samples=8, samples_per_event=1)})
    run_service(moved, Failpoints(), install_signals=False)
    assert [p["Sequence"] for p in read_payloads(store_dir, "t/h2")] == [[5], [6], [7]]
    with buffer_at(config.instances[0].buffer_file) as buffer:
        assert buffer.meta()["stream"] == "t/h2"


def test_an_mqtt_password_of_the_wrong_type_is_never_printed(write_config):
    table = {"driver": "mqtt", "stream": "t/m", "topics": ["a"], "password": 987654321}
    path = write_config({"m": table})
    result = run_cli("collect", "--config", str(path), timeout=60)
    assert result.returncode == 1
    assert "987654321" not in result.stderr + result.stdout
    assert "instances.m.password must be a non-empty text (a int was given; the value is not" in (
        result.stderr
    )


def test_the_mqtt_password_stays_out_of_the_settings_repr(make_config):
    table = {"driver": "mqtt", "stream": "t/m", "topics": ["a"], "password": "s3cret-pw"}
    config = make_config({"m": table})
    assert config.instances[0].options.password == "s3cret-pw"
    assert "s3cret-pw" not in repr(config)


def test_a_directories_entry_that_is_a_regular_file_is_reported_as_such(make_config, tmp_path):
    not_a_dir = tmp_path / "incoming.csv"
    not_a_dir.write_text("seq\n1\n")
    config = files_config(make_config, [not_a_dir])
    expected = f"directories entry {not_a_dir} is a regular file, not a directory"
    with pytest.raises(DriverError, match=re.escape(expected)):
        run_service(config, Failpoints(), install_signals=False)
    assert not_a_dir.read_text() == "seq\n1\n"


# --- the files driver and files that change after they were ingested ----------------------


def append_rows(path, first: int, count: int) -> None:
    with path.open("a") as fh:
        fh.writelines(f"{i},n{i},{i * 0.5}\n" for i in range(first, first + count))
    settle(path)


def test_a_csv_that_grows_after_ingestion_is_taken_from_where_it_stopped(
    make_config, service, store_dir, dirs
):
    a, _ = dirs
    path = csv_file(a / "log.csv", 0, 10)
    settle(path)
    config = files_config(make_config, [a])
    running = service(config)
    wait_for(lambda: len(rows_in(store_dir)) == 10)
    append_rows(path, 10, 7)
    wait_for(lambda: len(rows_in(store_dir)) == 17)
    append_rows(path, 17, 1)
    wait_for(lambda: len(rows_in(store_dir)) == 18)
    time.sleep(0.5)  # more scans: nothing taken twice
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == list(range(18))
    assert path.exists()  # left in place, and remembered at its new size


def test_a_csv_edited_after_ingestion_goes_to_the_failed_folder(
    make_config, service, store_dir, dirs, tmp_path
):
    a, _ = dirs
    path = a / "edited.csv"
    settle(csv_file(path, 0, 5))
    config = files_config(make_config, [a], failed_dir=str(tmp_path / "failed"))
    running = service(config)
    wait_for(lambda: len(rows_in(store_dir)) == 5)
    edited = path.read_text().replace("n2", "N2") + "5,n5,2.5\n"
    path.write_text(edited)
    settle(path)
    wait_for((tmp_path / "failed" / "edited.csv").exists)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == list(range(5))  # nothing twice
    assert (tmp_path / "failed" / "edited.csv").read_text() == edited  # kept, unchanged
    reason = (tmp_path / "failed" / "edited.csv.reason.txt").read_text()
    assert "it changed after it was ingested" in reason
    assert "(5 earlier rows of it were already sent)" in reason


def test_a_parquet_file_rewritten_after_ingestion_goes_to_the_failed_folder(
    make_config, service, store_dir, dirs, tmp_path
):
    a, _ = dirs
    path = a / "data.parquet"
    pq.write_table(pa.table({"seq": [0, 1, 2]}), path)
    settle(path)
    config = files_config(make_config, [a], format="parquet", failed_dir=str(tmp_path / "failed"))
    running = service(config)
    wait_for(lambda: len(rows_in(store_dir)) == 3)
    pq.write_table(pa.table({"seq": [0, 1, 2, 3]}), path)  # rewritten with one more row
    settle(path)
    wait_for((tmp_path / "failed" / "data.parquet").exists)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == [0, 1, 2]


def test_a_touched_file_is_not_taken_again(make_config, service, store_dir, dirs):
    a, _ = dirs
    path = a / "same.csv"
    settle(csv_file(path, 0, 4))
    config = files_config(make_config, [a])
    running = service(config)
    wait_for(lambda: counters(config).get("files_done", 0) == 1)
    settle(path)  # a new mtime, the same bytes
    time.sleep(1.0)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == [0, 1, 2, 3]
    assert path.exists() and counters(config).get("files_failed", 0) == 0


def test_a_stop_request_interrupts_the_ingestion_of_a_large_file(make_config, dirs, store_dir):
    a, _ = dirs
    path = csv_file(a / "big.csv", 0, 60_000)
    settle(path)
    config = files_config(make_config, [a], samples_per_event=10)
    stop = threading.Event()
    thread = threading.Thread(
        target=run_service, args=(config, Failpoints(), stop), kwargs={"install_signals": False}
    )
    thread.start()
    wait_for(lambda: len(read_payloads(store_dir, "lab/files")) > 0)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    with buffer_at(config.instances[0].buffer_file) as buffer:
        first = len(rows_in(store_dir)) + buffer.depth() * 10
    assert first < 60_000  # it stopped part-way
    again = threading.Event()
    rerun = threading.Thread(
        target=run_service, args=(config, Failpoints(), again), kwargs={"install_signals": False}
    )
    rerun.start()
    try:
        wait_for(lambda: len(rows_in(store_dir)) == 60_000, timeout=120)
    finally:
        again.set()
        rerun.join(60)
    assert [r["seq"] for r in rows_in(store_dir)] == list(range(60_000))
    assert path.exists()


@pytest.mark.parametrize(
    ("environ", "file", "directory"),
    [({}, 0o600, 0o700), ({"SLUICE_GROUP_READ": "1"}, 0o640, 0o750)],
)
def test_buffer_files_are_owner_only_unless_group_read_is_set(
    make_config, tmp_path, environ, file, directory
):
    config = make_config({"g": generator(max_samples=3, samples_per_event=1)}, environ)
    run_service(config, Failpoints(), install_signals=False)
    state = tmp_path / "state"
    assert state.stat().st_mode & 0o777 == directory
    for name in ("g.db", "g.db.lock"):
        assert (state / name).stat().st_mode & 0o777 == file, name


# --- a full disk under the buffer ----------------------------------------------------------
@pytest.fixture
def full_disk(tmp_path):
    """An 8 MiB disk with 5 MiB of it taken by a ballast file, unmounted afterwards."""
    with small_disk(tmp_path / "small-disk", "8m") as disk:
        if disk is None:
            pytest.skip("a small tmpfs disk needs root and mount")
        disk.take(5 << 20)
        yield disk.path


def test_a_full_disk_under_the_buffer_is_survived_and_every_sample_sent_once(
    make_config, store_dir, full_disk, service, caplog
):
    """The buffer's disk fills while sampling: the driver says why it fails, in one line, and
    retries; once space is freed sampling goes on, and every sample reaches the stream once,
    in order (the driver thread, and the log, used to die on recording the failure)."""
    samples = 6_000
    config = make_config(
        {"g": generator(max_samples=samples, samples_per_event=100, samples_per_sec=3000)},
        state_dir=str(full_disk / "collector"),
    )
    running = service(config)
    refused = "cannot write (no space left on its disk"

    def driver_refused() -> bool:
        return any(
            "driver failed" in r.getMessage() and refused in r.getMessage() for r in caplog.records
        )

    wait_for(driver_refused, timeout=30, explain=lambda: f"{running.result} {caplog.text}")
    assert not [r for r in caplog.records if r.exc_info], "one line, no traceback"
    (full_disk / "ballast").unlink()
    assert running.wait(timeout=90) == 0
    sequences = [s for p in read_payloads(store_dir, "t/h1") for s in p["Sequence"]]
    assert sequences == list(range(samples))


def test_a_collector_started_on_a_full_disk_says_so_in_one_line(make_config, full_disk):
    with contextlib.suppress(OSError), (full_disk / "filler").open("wb") as filler:
        while True:
            filler.write(b"\0" * 65536)
            filler.flush()
    config = make_config({"g": generator()}, state_dir=str(full_disk / "collector"))
    with pytest.raises(BufferNotWritable, match=re.escape("cannot write (no space left on")):
        run_service(config, Failpoints(), install_signals=False)


class FailingDriver:
    """Fails at once `quick` times, then runs `healthy` seconds before failing; then ends."""

    def __init__(self, quick: int, healthy: float) -> None:
        self.quick, self.healthy, self.runs = quick, healthy, 0

    def run(self, ctx) -> None:
        self.runs += 1
        if self.runs == self.quick + 1:
            time.sleep(self.healthy)
        if self.runs <= self.quick + 1:
            msg = f"sensor gone (run {self.runs})"
            raise OSError(msg)


def test_a_driver_that_ran_well_before_failing_is_restarted_soon(make_config, monkeypatch):
    """A failed driver is restarted after 1 s, then 2, 4, … up to 60 s while it keeps failing
    at once; one that ran for the longest wait before it failed starts over at the first (it
    used to wait as long as the failures of long ago had made it)."""
    from collectors import instance as module

    monkeypatch.setattr(module, "RESTART_FIRST", 0.01)
    monkeypatch.setattr(module, "RESTART_LONGEST", 0.2)
    delays: list[float] = []
    monkeypatch.setattr(
        module.Instance, "_driver_failed", lambda self, ctx, exc, delay: delays.append(delay)
    )
    config = make_config({"g": generator()})
    settings = config.instances[0]
    module.prepare_directory(settings, config.state_dir, config.file_modes)
    driver = FailingDriver(quick=6, healthy=0.25)
    running = module.Instance(settings, driver, Failpoints(), store_opener=unreachable)
    running.start()
    try:
        wait_for(lambda: not running.driver_running, timeout=30)
    finally:
        running.halt.set()
        wait_for(lambda: not running.sender_running, timeout=30)
        running.close()
    assert delays == [0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.01]
