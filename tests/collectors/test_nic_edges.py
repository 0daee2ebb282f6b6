"""NIC driver at the edges: counters past 2**63 or garbage, absurd rates, a sampling process that
is killed or hangs. A tmp directory stands in for /sys/class/net."""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from collectors.batch import ColumnBatch
from collectors.buffer import Buffer
from collectors.drivers.nic import NicDriver
from collectors.errors import ConfigError, DriverError
from collectors.instance import InstanceContext
from collectors.pacing import Pacer
from collectors.service import create_driver
from pipeline.failpoints import Failpoints

from .conftest import read_payloads, rewrite_counter, samplers, wait_for

TOP = 2**64 - 1  # the largest value of the kernel's u64 counters


@pytest.fixture
def sysfs(tmp_path) -> Path:
    """A stand-in for /sys/class/net with one interface, eth5, and its two counters."""
    root = tmp_path / "net"
    stats = root / "eth5" / "statistics"
    stats.mkdir(parents=True)
    (stats / "rx_bytes").write_text("100\n")
    (stats / "tx_bytes").write_text("7\n")
    return root


def nic_table(sysfs: Path, **extra: object) -> dict:
    return {
        "driver": "nic",
        "stream": "edge/net",
        "interface": "eth5",
        "sysfs_root": str(sysfs),
        "samples_per_sec": 100,
        "samples_per_event": 5,
    } | extra


def errors(config) -> list[tuple[str, str]]:
    buffer = Buffer(config.instances[0].buffer_file, 10)
    try:
        return buffer.conn.execute("SELECT source, message FROM errors ORDER BY id").fetchall()
    finally:
        buffer.close()


def rx(store_dir: Path) -> list[int]:
    return [v for p in read_payloads(store_dir, "edge/net") for v in p["RxBytes"]]


def test_counters_past_2_to_the_63_are_sampled_as_read(make_config, service, store_dir, sysfs):
    # A 64-bit counter near its wrap: the sampler packed it as a signed int64, crashed on
    # every start ("argument out of range"), and not one sample was taken, ever.
    stats = sysfs / "eth5" / "statistics"
    (stats / "rx_bytes").write_text(f"{TOP}\n")
    (stats / "tx_bytes").write_text(f"{2**63}\n")
    config = make_config({"net": nic_table(sysfs)})
    running = service(config)
    wait_for(lambda: len(rx(store_dir)) >= 5, timeout=15, explain=lambda: repr(errors(config)))
    rewrite_counter(stats / "rx_bytes", "3\n")  # it wrapped: kept as read, not "fixed"
    wait_for(lambda: 3 in rx(store_dir), timeout=15)
    assert running.stop() == 0
    payloads = read_payloads(store_dir, "edge/net")
    assert set(rx(store_dir)) == {TOP, 3}
    assert {v for p in payloads for v in p["TxBytes"]} == {2**63}
    assert errors(config) == [] or {s for s, _ in errors(config)} == {"nic.pace"}


def test_a_counter_that_is_not_a_counter_value_is_refused_not_sampled(
    make_config, service, store_dir, sysfs
):
    stats = sysfs / "eth5" / "statistics"
    config = make_config({"net": nic_table(sysfs)})
    running = service(config)
    wait_for(lambda: len(rx(store_dir)) >= 5, timeout=15)
    rewrite_counter(stats / "rx_bytes", "-3\n")  # garbage: the old sampler stored -3 as a sample
    wait_for(lambda: any(s == "nic.read" for s, _ in errors(config)), timeout=15)
    rewrite_counter(stats / "rx_bytes", "250\n")
    wait_for(lambda: 250 in rx(store_dir), timeout=15)
    assert running.stop() == 0
    assert set(rx(store_dir)) == {100, 250}
    message = next(m for s, m in errors(config) if s == "nic.read")
    assert f"{stats / 'rx_bytes'}: b'-3\\n ' is not a counter value" in message  # as read


@pytest.mark.parametrize("text", ["", "-1\n", "0x10\n", "1_000\n", f"{2**64}\n", "9" * 70])
def test_garbage_counters_are_refused_at_start_up(make_config, sysfs, text):
    (sysfs / "eth5" / "statistics" / "tx_bytes").write_text(text)
    config = make_config({"net": nic_table(sysfs)})
    with pytest.raises(DriverError, match=re.escape("cannot read statistic 'tx_bytes' of eth5")):
        create_driver(config.instances[0])


def test_a_rate_the_sampler_cannot_keep_is_refused(make_config, sysfs):
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "instances.net.samples_per_sec = 1000000.0 is more than the sampler can keep up "
            "with (10,000 a second); sample less often"
        ),
    ):
        make_config({"net": nic_table(sysfs, samples_per_sec=1e6)})


@pytest.mark.parametrize("slice_us", [-1, 1, 99, 100_001])
def test_a_sampler_slice_linux_does_not_take_is_refused(make_config, sysfs, slice_us):
    with pytest.raises(ConfigError, match=re.escape(f"sampler_slice_us = {slice_us} must be")):
        make_config({"net": nic_table(sysfs, sampler_slice_us=slice_us)})


def kernel_release() -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", platform.release()).groups()
    return int(major), int(minor)


def scheduler_slice(pid: int) -> int | None:
    """The time slice, in ns, the scheduler gives `pid` (None where /proc does not say)."""
    for line in Path(f"/proc/{pid}/sched").read_text().splitlines():
        if line.startswith("se.slice"):
            return int(line.split(":")[1])
    return None


@pytest.mark.parametrize("slice_us", [None, 0, 250])
def test_the_sampler_runs_with_the_slice_it_is_given(
    make_config, service, store_dir, sysfs, slice_us
):
    kernel_default = scheduler_slice(os.getpid())
    if kernel_default is None or kernel_release() < (6, 12):
        pytest.skip("Linux before 6.12 keeps its own slice (or /proc does not show it)")
    extra = {} if slice_us is None else {"sampler_slice_us": slice_us}
    running = service(make_config({"net": nic_table(sysfs, **extra)}))
    wait_for(lambda: len(samplers(sysfs)) == 1, timeout=15)
    (pid,) = samplers(sysfs)
    expected = {None: 100_000, 0: kernel_default, 250: 250_000}[slice_us]
    wait_for(lambda: scheduler_slice(pid) == expected, timeout=5)  # set as the sampler starts
    assert running.stop() == 0


def test_a_period_longer_than_a_timed_wait_can_take_is_waited_for():
    # 1e-300 samples a second: the pacer's one wait overflowed ("timestamp out of range"),
    # so the sampler died at once, and the driver restarted it every second, for ever.
    pacer, stop = Pacer(1e300), threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert not pacer.wait(stop)


def test_a_very_slow_rate_samples_nothing_and_reports_nothing(
    make_config, service, store_dir, sysfs
):
    config = make_config({"net": nic_table(sysfs, samples_per_sec=1e-300)})
    running = service(config)
    time.sleep(2.5)  # the old sampler had crashed twice by now
    assert running.stop() == 0
    assert rx(store_dir) == []
    assert errors(config) == []


def test_a_killed_sampler_is_reported_as_such_and_restarted(make_config, service, store_dir, sysfs):
    config = make_config({"net": nic_table(sysfs)})
    running = service(config)
    wait_for(lambda: len(rx(store_dir)) >= 5 and len(samplers(sysfs)) == 1, timeout=15)
    (first,) = samplers(sysfs)
    os.kill(first, signal.SIGKILL)  # the OOM killer, say: the counters are fine
    wait_for(lambda: samplers(sysfs) not in ([], [first]), timeout=15)
    before = len(rx(store_dir))
    wait_for(lambda: len(rx(store_dir)) > before, timeout=15)
    assert running.stop() == 0
    messages = [m for _, m in errors(config)]
    assert any(
        "the sampling process (collectors/nic_sampler.py) ended with status -9" in m
        for m in messages
    ), messages
    assert not any("cannot read the counters" in m for m in messages), messages


def test_a_sampler_that_ignores_sigterm_does_not_hold_up_a_stop(make_config, sysfs, tmp_path):
    # A counter read that hangs in the kernel: SIGTERM only sets the sampler's stop flag,
    # and the driver used to send SIGTERM every 250 ms for ever, never returning.
    config = make_config({"net": nic_table(sysfs)})
    settings = config.instances[0]
    driver = create_driver(settings)
    assert isinstance(driver, NicDriver)
    settings.buffer_file.parent.mkdir(parents=True, exist_ok=True)
    buffer = Buffer(settings.buffer_file, 100)
    stop = threading.Event()
    ctx = InstanceContext(settings, buffer, stop, Failpoints())
    hung = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print(flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    hung.stdout.readline()  # it ignores SIGTERM from here on
    batch = ColumnBatch(driver.columns, driver.constants)
    reader = threading.Thread(target=driver._read, args=(ctx, hung, batch), daemon=True)
    reader.start()
    stop.set()
    reader.join(10)
    try:
        assert not reader.is_alive(), "the driver never gave up on a hung sampler"
        assert hung.wait(5) == -signal.SIGKILL
    finally:
        hung.kill()
        hung.wait()
        buffer.close()
