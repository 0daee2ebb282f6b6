"""Kill -9 writer processes of the embedded store at random points; nothing acknowledged is lost,
nothing is duplicated or reordered, and no partial event is ever visible."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.streams import open_store

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


@pytest.mark.parametrize("mode", ["append", "txn"])
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


def commit_dying_at(store_dir: Path, stream: str, segments: int, patch: str, events: int) -> str:
    """Create `stream`, then in another process write `events` events in one transaction and
    commit it with `patch` applied (Python that makes a step of the commit call `os._exit(9)`):
    the id of the transaction the process died committing."""
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(stream, segments=segments)
    code = (
        f"import os; from pipeline.streams import open_store; {patch};"
        f"s = open_store('embedded:{store_dir}'); x = s.begin_transaction('{stream}');"
        f"[x.write(f'e{{i}}'.encode(), routing_key=f'k{{i}}') for i in range({events})];"
        "print(x.txn_id, flush=True); x.commit()"
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
