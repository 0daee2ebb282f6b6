"""Kill -9 reader processes of a reader group at random points while events are written and
segments split and merge: the group recovers their segments (by `reader_offline`, by a reader
that rejoins with the id, or by the heartbeat timeout), and nothing they had not committed is
lost; an event is delivered twice only if a killed reader had delivered it."""

from __future__ import annotations

import random
import signal
import time

import pytest

from pipeline.streams import open_store
from tests.streams.test_group_processes import (
    delivered,
    start_reader,
    stop,
    wait_until_read,
    write_while_scaling,
)

pytestmark = pytest.mark.slow

RECOVERIES = ["reader_offline", "same id", "timeout"]


def test_readers_killed_at_random_points_lose_nothing(tmp_path):
    rng = random.Random(11)
    store_dir, out_dir, stream = tmp_path / "streams", tmp_path / "out", "rg/kill"
    out_dir.mkdir()
    timeout_s = 1.0  # for the readers' heartbeat timeout
    total, killed = 0, set()
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(stream, segments=2)
        group = store.reader_group("workers", stream)
        procs = {
            f"r{i}": start_reader(store_dir, stream, "workers", f"r{i}", out_dir, timeout_s)
            for i in range(3)
        }
        for round_ in range(6):
            write_while_scaling(store, stream, group, 600, rng, first=total)
            total += 600
            time.sleep(rng.uniform(0.0, 0.3))
            victim = rng.choice(sorted(procs))
            procs.pop(victim).send_signal(signal.SIGKILL)
            killed.add(victim)
            how = RECOVERIES[round_ % 3]
            if how == "reader_offline":
                group.reader_offline(victim)
                name = f"n{round_}"
            elif how == "same id":
                name = victim
            else:
                name = f"n{round_}"  # the survivors take over once the victim's heartbeat is old
            procs[name] = start_reader(store_dir, stream, "workers", name, out_dir, timeout_s)
        wait_until_read(store, stream, group, list(procs.values()), deadline_s=120)
        stop(list(procs.values()), out_dir)
    rows = delivered(out_dir, with_reader=True)
    assert {seq for _, _, seq, _ in rows} == set(range(total)), "events were lost"
    seen: dict[int, str] = {}
    firsts: dict[str, list[int]] = {}
    for _, key, seq, reader in rows:
        if seq in seen:
            assert seen[seq] in killed or reader in killed, f"{seq} delivered twice"
            continue
        seen[seq] = reader
        firsts.setdefault(key, []).append(seq)
    for key, seqs in firsts.items():
        assert seqs == sorted(seqs), f"{key} first delivered out of order"
