"""The collector's stream gone under it: deleted, or its store replaced by an empty one.

The collector creates its stream again and goes on sending, but never silently: the events it
committed before are not in the new stream, and it says so in its log and its status."""

from __future__ import annotations

import logging
import shutil

from collectors.buffer import Buffer

from .conftest import read_payloads

GONE = "did not exist in embedded:{store}, so it was created again: the 10 events this buffer"


def generator(max_samples: int) -> dict:
    table = {"driver": "generator", "stream": "lab/gone", "samples_per_sec": 100_000}
    return {"gen": table | {"samples_per_event": 100, "max_samples": max_samples}}


def test_a_store_replaced_by_an_empty_one_is_reported(
    make_config, service, store_dir, tmp_path, caplog
):
    assert service(make_config(generator(1_000))).wait() == 0
    shutil.rmtree(store_dir)  # the store's disk replaced by an empty one
    with caplog.at_level(logging.ERROR, logger="collectors.sender"):
        assert service(make_config(generator(2_000))).wait() == 0
    sequences = [s for p in read_payloads(store_dir, "lab/gone") for s in p["Sequence"]]
    assert sequences == list(range(1_000, 2_000))  # only what was sent since
    assert GONE.format(store=store_dir) in caplog.text
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    (message,) = buffer.conn.execute("SELECT message FROM errors").fetchone()
    assert GONE.format(store=store_dir) in message
    buffer.close()


def test_a_first_start_creates_its_stream_without_a_word(make_config, service, tmp_path):
    assert service(make_config(generator(500))).wait() == 0
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    assert buffer.conn.execute("SELECT count(*) FROM errors").fetchone()[0] == 0
    buffer.close()
