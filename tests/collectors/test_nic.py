"""NIC driver: the NetworkDriver event layout from a real interface, pacing, a vanishing counter."""

from __future__ import annotations

import itertools
import json
import threading
import time

from collectors.batch import camel_case, format_timestamp
from collectors.buffer import Buffer
from collectors.pacing import Pacer

from .conftest import read_payloads, rewrite_counter, samplers, wait_for


def test_the_timestamp_format_is_the_references():
    assert format_timestamp(1609363757809000000) == "2020-12-30T21:29:17.809Z"
    assert format_timestamp(1609363757809999999) == "2020-12-30T21:29:17.809Z"
    assert camel_case("rx_bytes") == "RxBytes"
    assert camel_case("rx_crc_errors") == "RxCrcErrors"


def test_loopback_counters_in_the_reference_layout(make_config, service, store_dir):
    config = make_config(
        {
            "net": {
                "driver": "nic",
                "stream": "examples/network",
                "interface": "lo",
                "samples_per_sec": 200,
                "samples_per_event": 50,
                "routing_key": "edge-01",
            }
        }
    )
    running = service(config)
    # six events of 50 at 200/s: about 1.5 s, longer on a loaded machine, where the pacer
    # skips the ticks it is late for
    wait_for(lambda: len(read_payloads(store_dir, "examples/network")) >= 6)
    assert running.stop() == 0
    payloads = read_payloads(store_dir, "examples/network")
    assert len(payloads) >= 6
    first = payloads[0]
    assert list(first) == [
        "TimestampNanos",
        "RxBytes",
        "TxBytes",
        "RemoteAddr",
        "Interface",
        "LastTimestampFormatted",
    ]
    assert (first["RemoteAddr"], first["Interface"]) == ("edge-01", "lo")
    assert len(first["TimestampNanos"]) == len(first["RxBytes"]) == 50
    assert first["LastTimestampFormatted"] == format_timestamp(first["TimestampNanos"][-1])
    raw = json.dumps(first, separators=(",", ":"))
    assert raw.startswith('{"TimestampNanos":[') and " " not in raw.replace("edge-01", "")
    times = [t for p in payloads for t in p["TimestampNanos"]]
    assert times == sorted(times)
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    assert 4_000_000 <= gaps[len(gaps) // 2] <= 6_000_000  # median interval ~5 ms
    rx = [v for p in payloads for v in p["RxBytes"]]
    assert rx == sorted(rx)  # a byte counter never goes back
    assert sum(len(p["TimestampNanos"]) for p in payloads) >= 250


def test_extra_statistics_add_arrays(make_config, service, store_dir):
    config = make_config(
        {
            "net": {
                "driver": "nic",
                "stream": "examples/network",
                "interface": "lo",
                "statistics": ["rx_packets", "tx_bytes", "rx_errors"],
                "samples_per_sec": 100,
                "samples_per_event": 20,
            }
        }
    )
    running = service(config)
    time.sleep(0.5)
    running.stop()
    first = read_payloads(store_dir, "examples/network")[0]
    assert list(first)[:4] == ["TimestampNanos", "RxPackets", "TxBytes", "RxErrors"]


def test_a_counter_that_goes_away_is_reported_and_sampling_resumes(
    make_config, service, store_dir, tmp_path
):
    root = tmp_path / "net"
    stats = root / "wlan9" / "statistics"
    stats.mkdir(parents=True)
    (stats / "rx_bytes").write_text("100\n")
    (stats / "tx_bytes").write_text("7\n")
    config = make_config(
        {
            "net": {
                "driver": "nic",
                "stream": "examples/network",
                "interface": "wlan9",
                "sysfs_root": str(root),
                "samples_per_sec": 100,
                "samples_per_event": 10,
            }
        }
    )
    running = service(config)

    def values() -> list[int]:
        return [v for p in read_payloads(store_dir, "examples/network") for v in p["RxBytes"]]

    wait_for(lambda: len(values()) > 0)
    rewrite_counter(stats / "rx_bytes", "not a number\n")  # the interface went away
    time.sleep(1.0)
    rewrite_counter(stats / "rx_bytes", "250\n")
    wait_for(lambda: 250 in values())
    running.stop()
    assert values()[0] == 100 and values()[-1] == 250
    assert set(values()) == {100, 250}  # no invented values while it was gone
    buffer = Buffer(config.instances[0].buffer_file, 10)
    # (a loaded machine may also have logged the pacer falling behind: "nic.pace")
    (message,) = buffer.conn.execute(
        "SELECT message FROM errors WHERE source = 'nic.read' ORDER BY id LIMIT 1"
    ).fetchone()
    assert "cannot read the counters of wlan9" in message


def test_realtime_priority_is_used_or_refused_once_and_sampling_goes_on(
    make_config, service, store_dir
):
    config = make_config(
        {
            "net": {
                "driver": "nic",
                "stream": "examples/network",
                "interface": "lo",
                "samples_per_sec": 500,
                "samples_per_event": 50,
                "realtime_priority": 10,
            }
        }
    )
    running = service(config)

    def samples() -> int:
        return sum(len(p["RxBytes"]) for p in read_payloads(store_dir, "examples/network"))

    wait_for(lambda: samples() >= 300)  # about 0.6 s at 500/s on an idle machine
    running.stop()
    assert samples() >= 300
    errors = (
        Buffer(config.instances[0].buffer_file, 10)
        .conn.execute("SELECT source, message FROM errors")
        .fetchall()
    )
    # The priority is refused at most once. A loaded machine may also let the pacer
    # fall behind ("nic.pace"): the stall test below covers that.
    refusals = [message for source, message in errors if source == "nic.realtime"]
    assert len(refusals) <= 1
    assert {source for source, _ in errors} <= {"nic.realtime", "nic.pace"}


def test_the_sampler_process_dies_with_the_collector(write_config, tmp_path):
    import signal
    import subprocess
    import sys

    from .conftest import REPO

    root = tmp_path / "net-unique-root"
    stats = root / "eth7" / "statistics"
    stats.mkdir(parents=True)
    for name in ("rx_bytes", "tx_bytes"):
        (stats / name).write_text("1\n")
    path = write_config(
        {"net": {"driver": "nic", "stream": "a/b", "interface": "eth7", "sysfs_root": str(root)}}
    )
    collector = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "collect", "--config", str(path)], cwd=REPO
    )

    wait_for(lambda: len(samplers(root)) == 1, timeout=30)
    collector.send_signal(signal.SIGKILL)
    collector.wait()
    wait_for(lambda: samplers(root) == [], timeout=10)


def test_after_a_stall_the_pacer_skips_the_passed_ticks_instead_of_bursting():
    pacer, stop = Pacer(0.001), threading.Event()
    for _ in range(5):
        assert pacer.wait(stop)
    time.sleep(0.05)  # the machine stalls for 50 periods
    assert pacer.wait(stop)
    after_stall = time.monotonic()
    taken = 0
    while time.monotonic() - after_stall < 0.002:
        assert pacer.wait(stop)
        taken += 1
    assert pacer.missed >= 45  # counted, shown as "fell behind"
    assert taken <= 3  # the old pacer fired the 50 missed ticks back to back here
    stop.set()
    assert not pacer.wait(stop)
