"""Generator driver at the edges: rates near zero or near the float limit, max_samples smaller
than one event."""

from __future__ import annotations

import time

from collectors.buffer import Buffer

from .conftest import read_payloads, wait_for


def gen_table(**extra: object) -> dict:
    return {"driver": "generator", "stream": "lab/gen", "samples_per_event": 10} | extra


def errors(config) -> list[tuple[str, str]]:
    buffer = Buffer(config.instances[0].buffer_file, 10)
    try:
        return buffer.conn.execute("SELECT source, message FROM errors").fetchall()
    finally:
        buffer.close()


def sequences(store_dir) -> list[int]:
    return [s for p in read_payloads(store_dir, "lab/gen") for s in p["Sequence"]]


def test_a_rate_near_zero_waits_quietly(make_config, service, store_dir):
    # 1e-300 a second: the sample period overflowed (round(inf)), and the driver failed
    # and was restarted with a traceback, for ever
    config = make_config({"gen": gen_table(samples_per_sec=1e-300)})
    running = service(config)
    time.sleep(1.5)
    assert running.stop() == 0
    assert sequences(store_dir) == []
    assert errors(config) == []


def test_a_slow_rate_whose_event_is_centuries_away_waits_quietly(make_config, service, store_dir):
    # one event due in 1e13 s: a single timed wait that long overflowed
    config = make_config({"gen": gen_table(samples_per_sec=1e-12)})
    running = service(config)
    time.sleep(1.5)
    assert running.stop() == 0
    assert errors(config) == []


def test_a_rate_near_the_float_limit_is_as_fast_as_the_buffer_takes(
    make_config, service, store_dir
):
    # the largest float a second: after 1 s the schedule's sample count became infinite and the
    # driver failed (OverflowError), again after every restart
    config = make_config(
        {"gen": gen_table(samples_per_sec=1.7976931348623157e308, capacity_events=20)}
    )
    running = service(config)
    time.sleep(2.5)
    assert running.stop() == 0
    got = sequences(store_dir)
    assert got == list(range(len(got))) and got
    assert errors(config) == []


def test_max_samples_below_one_event_ends_when_they_are_due(make_config, service, store_dir):
    # 5 samples at 10 a second, 1000 to an event: it waited for a whole event (100 s)
    table = gen_table(samples_per_sec=10, samples_per_event=1000, max_samples=5)
    running = service(make_config({"gen": table}))
    wait_for(lambda: not running.thread.is_alive(), timeout=20)
    assert running.wait() == 0
    assert sequences(store_dir) == [0, 1, 2, 3, 4]
