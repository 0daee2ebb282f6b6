"""Kill -9 writer processes of the embedded store at random points; nothing acknowledged is lost,
nothing is duplicated or reordered, and no partial event is ever visible."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from pipeline.streams import StreamStoreError, TxnFailed, open_store

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("store_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def start_worker(store_dir, stream, name, mode, state_dir) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(WORKER), str(store_dir), stream, name, mode, str(state_dir)]
    return subprocess.Popen(args, env=env, stderr=subprocess.PIPE)


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (a process of its own, as a crashed writer was)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


def check_stream(store_dir, stream, names, state_dir) -> None:
    """Reopen the store (repairing torn tails) and check every writer's events."""
    from tests.reliability.store_worker import payload

    with open_store(f"embedded:{store_dir}") as store:
        events = list(store.read(stream))
        seen: dict[str, list[int]] = {n: [] for n in names}
        for event in events:
            name, seq, _ = event.payload.split(b":", 2)
            name = name.decode()
            assert event.payload == payload(name, int(seq)), "a torn or corrupt event is visible"
            assert event.routing_key == name
            seen[name].append(int(seq))
        for name in names:
            acked = (
                int((state_dir / f"{name}.acked").read_text() or 0)
                if (state_dir / f"{name}.acked").exists()
                else 0
            )
            seqs = seen[name]
            assert seqs == sorted(set(seqs)), f"{name}: duplicated or reordered events"
            assert seqs == list(range(1, len(seqs) + 1)), f"{name}: a gap in the events"
            assert len(seqs) >= acked, f"{name}: acknowledged events {len(seqs) + 1}..{acked} lost"


@pytest.mark.parametrize("mode", ["append", "txn", "txn-unflushed"])
def test_kill9_writers_at_random_points(tmp_path, mode):
    rng = random.Random(int(os.environ.get("SLUICE_CRASH_SEED", "0")) or None)
    store_dir, state_dir = tmp_path / "streams", tmp_path / "state"
    state_dir.mkdir()
    stream = "crash/events"
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(stream, segments=2)
    names = ["w0", "w1"]
    kills = 0
    while kills < 30:
        procs = [start_worker(store_dir, stream, n, mode, state_dir) for n in names]
        time.sleep(rng.uniform(0.15, 0.6))
        for proc in procs:
            time.sleep(rng.uniform(0, 0.02))
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait()
            assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
            kills += 1
        check_stream(store_dir, stream, names, state_dir)
    assert kills >= 30


def test_torn_tail_and_garbage_are_repaired_on_open(tmp_path):
    store_dir = tmp_path / "streams"
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("crash/torn")
        with store.writer("crash/torn") as w:
            for i in range(5):
                w.write(f"e{i}".encode())
    segfile = next((store_dir / "data").rglob("0.seg"))
    good = segfile.read_bytes()
    with segfile.open("ab") as fh:  # the start of a block that a crash cut short, then noise
        fh.write(good[:40] + os.urandom(333))
    with open_store(f"embedded:{store_dir}") as store:
        assert [e.payload for e in store.read("crash/torn")] == [f"e{i}".encode() for i in range(5)]
        assert segfile.stat().st_size == len(good), "the torn tail is truncated on open"
        with store.writer("crash/torn") as w:
            w.write(b"after")
        assert [e.payload for e in store.read("crash/torn")][-1] == b"after"


def test_transaction_looked_up_after_restart(tmp_path):
    store_dir = tmp_path / "streams"
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("crash/txn", segments=2)
    code = (
        "import sys; from pipeline.streams import open_store;"
        f"s = open_store('embedded:{store_dir}'); t = s.begin_transaction('crash/txn');"
        "[t.write(f'e{i}'.encode(), routing_key=f'k{i}') for i in range(10)]; t.flush();"
        "print(t.txn_id)"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    txn_id = out.stdout.strip()
    with open_store(f"embedded:{store_dir}") as store:
        assert list(store.read("crash/txn")) == []
        store.get_transaction("crash/txn", txn_id).commit()
        store.get_transaction("crash/txn", txn_id).commit()
        assert sorted(e.payload for e in store.read("crash/txn")) == sorted(
            f"e{i}".encode() for i in range(10)
        )


def commit_dying_at(  # noqa: PLR0917 - one transaction's shape and where it dies
    store_dir: Path,
    stream: str,
    segments: int,
    patch: str,
    events: int,
    key: str = "k{i}",
    flush: bool = False,
) -> str:
    """Create `stream`, then in another process write `events` events in one transaction
    (routing key `key`, formatted with the event's number; flushed first if `flush`) and commit
    it with `patch` applied (Python that makes a step of the commit call `os._exit(9)`): the id
    of the transaction the process died committing."""
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(stream, segments=segments)
    code = (
        f"import os; from pipeline.streams import open_store; {patch};"
        f"s = open_store('embedded:{store_dir}'); x = s.begin_transaction('{stream}');"
        f"[x.write(f'e{{i}}'.encode(), routing_key=f'{key}') for i in range({events})];"
        f"{'x.flush();' if flush else ''} print(x.txn_id, flush=True); x.commit()"
    )
    out = run_python(code)
    assert out.returncode == 9, out.stderr
    return out.stdout.strip()


def test_crash_between_segments_of_a_commit_rolls_forward(tmp_path):
    """The process dies after the first segment's block landed; a later commit finishes."""
    store_dir = tmp_path / "streams"
    patch = (
        "from pipeline.streams.embedded import transactions as t;"
        "t.EmbeddedTransaction._mark_done = lambda self, seg: os._exit(9)"
    )
    txn_id = commit_dying_at(store_dir, "crash/half", 4, patch, events=40)
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.get_transaction("crash/half", txn_id)
        assert txn.state() == "committing"
        txn.commit()
        payloads = sorted(e.payload for e in store.read("crash/half"))
        assert payloads == sorted(f"e{i}".encode() for i in range(40)), "exactly once"


def test_crash_after_entering_committing_before_the_block_lands(tmp_path):
    """The process dies after `committing` and `appended_at` were recorded, before any block
    was written: nothing is visible, and a later commit lands every event exactly once."""
    store_dir = tmp_path / "streams"
    patch = (
        "from pipeline.streams.embedded import engine as e;"
        "e.Engine.append_block = lambda *a, **k: os._exit(9)"
    )
    txn_id = commit_dying_at(store_dir, "crash/early", 2, patch, events=20)
    with open_store(f"embedded:{store_dir}") as store:
        assert list(store.read("crash/early")) == []
        txn = store.get_transaction("crash/early", txn_id)
        assert txn.state() == "committing"
        txn.commit()
        txn.commit()
        payloads = sorted(e.payload for e in store.read("crash/early"))
        assert payloads == sorted(f"e{i}".encode() for i in range(20)), "exactly once"
        assert txn.state() == "committed"


#: Steps of a one-segment commit (its block appended straight from memory and its flushed
#: body), each made to kill the process, and whether the transaction committed by then.
ONE_SEGMENT_STEPS = {
    "before the landing is recorded": (
        "t.EmbeddedTransaction._mark_landing = lambda *a, **k: os._exit(9)",
        False,
    ),
    "after the landing is recorded, before the block": (
        "t.EmbeddedTransaction._land_one = lambda *a, **k: os._exit(9)",
        False,
    ),
    "half of the block written": (
        "from pipeline.streams.embedded import segment as sg;"
        "sg.SegmentFile.append = lambda self, at, parts: ("
        "os.pwrite(self.fd, b''.join(parts)[: sum(map(len, parts)) // 2], at), os._exit(9))",
        False,
    ),
    "the whole block written, before its fsync": (
        "from pipeline.streams.embedded import segment as sg;"
        "sg.SegmentFile.append = lambda self, at, parts: (os.pwritev(self.fd, parts, at),"
        " os._exit(9))",
        True,
    ),
    "the block fsynced, before `committed` is recorded": (
        "t.EmbeddedTransaction._mark_landed = lambda *a, **k: os._exit(9)",
        True,
    ),
    "after `committed` is recorded, before the flushed body is removed": (
        "landed = t.EmbeddedTransaction._mark_landed;"
        "t.EmbeddedTransaction._mark_landed = lambda *a, **k: (landed(*a, **k), os._exit(9))",
        True,
    ),
}


@pytest.mark.parametrize("flush", [False, True], ids=["unflushed", "flushed"])
@pytest.mark.parametrize("step", list(ONE_SEGMENT_STEPS))
def test_kill9_inside_a_one_segment_commit(tmp_path, step, flush):
    """Killed at each step of a one-segment commit, the transaction is committed exactly once
    (its block landed whole: `state()` says so, abort is refused, commit is a no-op) or open
    with nothing of it visible (abortable; its flushed events commit on a retry)."""
    patch, landed = ONE_SEGMENT_STEPS[step]
    store_dir = tmp_path / "streams"
    patch = f"from pipeline.streams.embedded import transactions as t; {patch}"
    txn_id = commit_dying_at(store_dir, "crash/one", 2, patch, events=15, key="k", flush=flush)
    expected = [f"e{i}".encode() for i in range(15)]
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.get_transaction("crash/one", txn_id)
        if landed:
            assert txn.state() == "committed"
            with pytest.raises(TxnFailed, match="already committed"):
                txn.abort()
        else:
            assert list(store.read("crash/one")) == [], "nothing of it is visible"
            assert txn.state() == "open"
        txn.commit()
        txn.commit()
        assert txn.state() == "committed"
        payloads = [e.payload for e in store.read("crash/one")]
        assert payloads == (expected if landed or flush else []), "exactly once, in order"
        assert not list((store_dir / "txn").glob(f"{txn_id}.*")), "its body is removed"
        assert store.verify().ok
        with store.writer("crash/one") as w:  # the segment takes writes after it
            w.write(b"after", routing_key="k")
        assert [e.payload for e in store.read("crash/one")][-1] == b"after"


def test_kill9_before_the_block_then_abort(tmp_path):
    """A transaction whose process died before its block landed whole can be aborted, and
    nothing of it ever becomes visible."""
    store_dir = tmp_path / "streams"
    patch = ONE_SEGMENT_STEPS["half of the block written"][0]
    txn_id = commit_dying_at(store_dir, "crash/abort", 1, patch, events=5, key="k", flush=True)
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.get_transaction("crash/abort", txn_id)
        txn.abort()
        assert txn.state() == "aborted"
        with pytest.raises(TxnFailed):
            txn.commit()
        assert list(store.read("crash/abort")) == []
        assert store.verify().ok


def snapshot_catalog(store_dir: Path, into: Path) -> None:
    """Copy the catalog (its database and write-ahead log) between two of its transactions."""
    into.mkdir(exist_ok=True)
    for name in ("catalog.db", "catalog.db-wal"):
        if (store_dir / name).exists():
            shutil.copyfile(store_dir / name, into / name)


def restore_catalog(store_dir: Path, snapshot: Path) -> None:
    """Put the catalog back as it was at the snapshot: what a power cut does to the catalog
    writes made with synchronous=NORMAL since (none of them reached the disk)."""
    for path in store_dir.glob("catalog.db*"):
        path.unlink()
    for path in snapshot.iterdir():
        shutil.copyfile(path, store_dir / path.name)


@pytest.mark.parametrize("lost_from", ["_mark_landing", "_land_one"])
@pytest.mark.parametrize("flush", [False, True], ids=["unflushed", "flushed"])
def test_power_cut_after_a_one_segment_commit_keeps_it(tmp_path, lost_from, flush):
    """A power cut loses the catalog writes of a one-segment commit (synchronous=NORMAL) but
    not its fsynced block: the transaction is found committed, exactly once, and cannot be
    aborted; with `_mark_landing` lost the catalog says `open` (or has no row: a begin
    records none), with `_land_one` `landing`."""
    store_dir, snapshot = tmp_path / "streams", tmp_path / "snapshot"
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("cut/one", segments=2)
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from pipeline.streams import open_store
        from pipeline.streams.embedded import transactions as t
        from tests.reliability.test_store_crash import snapshot_catalog

        original = t.EmbeddedTransaction.{lost_from}

        def hooked(*args, **kwargs):
            snapshot_catalog(Path('{store_dir}'), Path('{snapshot}'))
            return original(*args, **kwargs)

        t.EmbeddedTransaction.{lost_from} = hooked
        s = open_store('embedded:{store_dir}')
        x = s.begin_transaction('cut/one')
        for i in range(9):
            x.write(f'e{{i}}'.encode(), routing_key='k')
        if {flush}:
            x.flush()
        x.commit()
        print(x.txn_id)
        """
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    txn_id = out.stdout.strip()
    restore_catalog(store_dir, snapshot)
    with closing(sqlite3.connect(store_dir / "catalog.db")) as db:
        found = db.execute("SELECT state FROM txns WHERE txn_id=?", (txn_id,)).fetchone()
    if lost_from == "_land_one":
        assert found == ("landing",), "the cut's view"
    else:  # a begin records nothing; a flush records the transaction open
        assert found == (("open",) if flush else None), "the cut's view"
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.get_transaction("cut/one", txn_id)
        assert txn.state() == "committed"
        with pytest.raises(TxnFailed, match="already committed"):
            txn.abort()
        txn.commit()
        assert [e.payload for e in store.read("cut/one")] == [f"e{i}".encode() for i in range(9)]
        assert store.verify().ok


def _commit_by_id(store_dir: str, stream: str, txn_id: str, start: Any) -> None:
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.get_transaction(stream, txn_id)
        start.wait()
        txn.commit()


def commit_twice_at_once(store_dir: Path, stream: str, txn_id: str) -> None:
    """Two processes commit `txn_id` at the same moment; both must exit cleanly."""
    start = mp.Barrier(2)
    procs = [
        mp.Process(target=_commit_by_id, args=(str(store_dir), stream, txn_id, start))
        for _ in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0


@pytest.mark.parametrize("segments", [1, 2], ids=["one segment", "two segments"])
def test_two_processes_committing_one_transaction_land_it_once(tmp_path, segments):
    """A retried commit racing the first (two drivers, say) lands the events exactly once,
    whether the transaction lands in one segment (its block is the commit) or in two."""
    store_dir, stream = tmp_path / "streams", "race/one"
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(stream, segments=2)
        expected = []
        for round_ in range(12):
            txn = store.begin_transaction(stream)
            for i in range(5):
                key = "k" if segments == 1 else f"k{i}"
                txn.write(f"r{round_}e{i}".encode(), routing_key=key)
                expected.append(f"r{round_}e{i}".encode())
            txn.flush()
            commit_twice_at_once(store_dir, stream, txn.txn_id)
            assert txn.state() == "committed"
        assert sorted(e.payload for e in store.read(stream)) == sorted(expected), "exactly once"
        assert store.verify().ok


@pytest.mark.parametrize("dies", ["before any block", "after the first block"])
def test_two_processes_rolling_a_crashed_commit_forward_land_it_once(tmp_path, dies):
    """A commit over four segments died half-way; two processes then commit it at once, while
    a writer appends to the same segments: every event lands exactly once."""
    store_dir, stream = tmp_path / "streams", "race/crashed"
    patch = (
        "from pipeline.streams.embedded import engine as e;"
        "e.Engine.append_block = lambda *a, **k: os._exit(9)"
        if dies == "before any block"
        else "from pipeline.streams.embedded import transactions as t;"
        "t.EmbeddedTransaction._mark_done = lambda self, seg: os._exit(9)"
    )
    txn_id = commit_dying_at(store_dir, stream, 4, patch, events=40)
    with open_store(f"embedded:{store_dir}") as store, store.writer(stream) as w:
        for i in range(8):  # other blocks land where the dead commit meant to land its own
            w.write(f"w{i}".encode(), routing_key=f"k{i}")
    commit_twice_at_once(store_dir, stream, txn_id)
    with open_store(f"embedded:{store_dir}") as store:
        payloads = sorted(e.payload for e in store.read(stream))
        expected = [f"e{i}".encode() for i in range(40)] + [f"w{i}".encode() for i in range(8)]
        assert payloads == sorted(expected), "exactly once"
        assert store.get_transaction(stream, txn_id).state() == "committed"
        assert store.verify().ok


@pytest.mark.parametrize(
    "dies",
    ["before store.json", "after store.json"],
)
def test_kill9_while_the_first_open_creates_the_store(tmp_path, dies):
    """A process killed while it creates a new store (its `store.json` written or not, the
    catalog's transaction not committed) leaves a store that opens and works, keeping the id
    of its `store.json`; it used to be refused as a catalog lost over data."""
    store_dir = tmp_path / "streams"
    before = dies == "before store.json"
    patch = (
        "from pipeline.streams.embedded import binding as b; w = b.write_store_id;"
        f"b.write_store_id = lambda *a: ({'os._exit(9), ' if before else ''}w(*a), os._exit(9))"
    )
    out = run_python(
        f"import os; {patch}; from pipeline.streams import open_store;"
        f" open_store('embedded:{store_dir}').list_streams()"
    )
    assert out.returncode == 9, out.stderr
    assert (store_dir / "store.json").exists() != before
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("c/s")
        with store.writer("c/s") as w:
            w.write(b"first", routing_key="k")
        assert [e.payload for e in store.read("c/s")] == [b"first"]
        assert store.verify().ok
    with open_store(f"embedded:{store_dir}") as store:
        assert store.list_streams() == ["c/s"]


@pytest.mark.parametrize("dies", ["writing the manifests", "before store.json"])
def test_kill9_while_a_version_1_store_is_adopted(tmp_path, dies):
    """A process killed while it upgrades a version-1 store (some manifests written, or the
    catalog committed and `store.json` not yet) leaves a store that opens and keeps its
    events; a `store.json` written first used to make it a version-1 catalog "older than the
    data", refused for good (`repair` found no manifests to rebuild from)."""
    from tests.streams.test_integrity import make_version_1

    store_dir = tmp_path / "streams"
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("v1/s", segments=2)
        with store.writer("v1/s") as writer:
            for i in range(20):
                writer.write(f"e{i}".encode(), routing_key=f"k{i}")
    make_version_1(store_dir)
    step = "write_manifest" if dies == "writing the manifests" else "write_store_id"
    patch = (
        f"from pipeline.streams.embedded import binding as b; w = b.{step};"
        f"b.{step} = lambda *a: (w(*a) if {step == 'write_manifest'} else None, os._exit(9))"
    )
    out = run_python(
        f"import os; {patch}; from pipeline.streams import open_store;"
        f" open_store('embedded:{store_dir}').list_streams()"
    )
    assert out.returncode == 9, out.stderr
    assert not (store_dir / "store.json").exists()
    with open_store(f"embedded:{store_dir}") as store:
        assert sorted(e.payload for e in store.read("v1/s")) == sorted(
            f"e{i}".encode() for i in range(20)
        )
        assert store.verify().ok
    assert (store_dir / "store.json").exists()


def truncated_in_the_middle(store, stream: str, events: int, kept: int) -> None:
    """A one-segment stream of `events` blocks of one 5 kB event each, truncated to the last
    `kept` (its head is then mid-file, the bytes before it punched away)."""
    store.create_stream(stream, segments=1)
    with store.writer(stream) as writer:
        for i in range(events):
            writer.write(b"x" * 5000 + f"e{i}".encode(), routing_key="k")
            writer.flush()
            if i == events - kept - 1:
                middle = store.tail(stream)
    store.truncate(middle)


@pytest.mark.parametrize(
    "dies", ["filling the catalog", "indexing the segments", "recording transactions"]
)
def test_kill9_while_repair_rebuilds_a_lost_catalog(tmp_path, dies):
    """A `repair` killed while it rebuilds a lost catalog leaves one that is refused (run
    repair again), never one that serves what it has not finished: the truncated stream's
    segment, not indexed yet, was read from offset 0 (its head punched away), marked damaged
    and its reads refused with a cut "before the start cut"."""
    store_dir = tmp_path / "streams"
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("r/txn", segments=2)
        truncated_in_the_middle(store, "r/cut", events=30, kept=15)
        txn = store.begin_transaction("r/txn")
        for i in range(6):
            txn.write(f"t{i}".encode(), routing_key=f"k{i}")
        txn.commit()
        written = {s: sorted(e.payload for e in store.read(s)) for s in store.list_streams()}
    for name in ("catalog.db", "catalog.db-wal", "catalog.db-shm"):
        (store_dir / name).unlink(missing_ok=True)
    step = {
        "filling the catalog": "fill_catalog",
        "indexing the segments": "index_segment",
        "recording transactions": "record_transactions",
    }[dies]
    patch = (
        f"from pipeline.streams.embedded import rebuild as r; f = r.{step};"
        f" r.{step} = lambda *a, **k: (f(*a, **k), os._exit(9))"
    )
    out = run_python(
        f"import os; {patch}; from pipeline.streams import open_store;"
        f" open_store('embedded:{store_dir}').repair()"
    )
    assert out.returncode == 9, out.stderr
    with open_store(f"embedded:{store_dir}") as store:
        with pytest.raises(StreamStoreError, match="run `sluice store repair`"):
            store.list_streams()
        assert not store.verify().ok
        assert store.repair().fixed
    with open_store(f"embedded:{store_dir}") as store:
        assert {s: sorted(e.payload for e in store.read(s)) for s in written} == written
        assert store.verify().ok, store.verify().problems


def test_kill9_while_repair_drops_the_index_of_a_shortened_file(tmp_path):
    """A segment file cut short below the stream's head: `repair` drops the index rows the
    file lost and moves the head back in one transaction. Killed between the two (as it used
    to be made), the head stayed past the data: `verify` and `repair` found nothing wrong, and
    an acknowledged write landed below the head, never to be read."""
    store_dir = tmp_path / "streams"
    with open_store(f"embedded:{store_dir}") as store:
        truncated_in_the_middle(store, "r/short", events=30, kept=10)
    (segment,) = (store_dir / "data").rglob("*.seg")
    os.truncate(segment, 50_000)  # below the head: every event the stream still held is lost
    patch = (
        "from pipeline.streams.embedded import engine as e;"
        " e.Engine.changing = lambda self, row: os._exit(9)"
    )
    out = run_python(
        f"import os; {patch}; from pipeline.streams import open_store;"
        f" open_store('embedded:{store_dir}').repair()"
    )
    assert out.returncode == 9, out.stderr
    with open_store(f"embedded:{store_dir}") as store:
        assert not store.verify().ok, "the lost events are still reported"
        report = store.repair()
        assert [p.what for p in report.unfixed] == [
            "the segment file ends at 50000: 10 events in 10 blocks from 101230 to 151850 are lost"
        ]
        with store.writer("r/short") as writer:
            writer.write(b"after", routing_key="k")
        assert [e.payload for e in store.read("r/short")] == [b"after"]
        assert store.verify().ok
