"""Collector settings: collector.toml, the Pravega Sensor Collector's variables, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collectors.errors import ConfigError
from collectors.settings import load_settings
from pipeline.streams import DEFAULT_TXN_LEASE_SECONDS

from .conftest import REPO, run_cli

EXAMPLE = REPO / "collectors" / "collector.example.toml"

# The Pravega Sensor Collector's conf/env-sample-network-standalone.sh, as its users have it.
REFERENCE_NETWORK_ENV = {
    "PRAVEGA_SENSOR_COLLECTOR_NET1_CLASS": "io.pravega.sensor.collector.network.NetworkDriver",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_NETWORK_INTERFACE": "ens33",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_MEMORY_QUEUE_CAPACITY_ELEMENTS": "10000",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_SAMPLES_PER_EVENT": "1000",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_SAMPLES_PER_SEC": "1000",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_PERSISTENT_QUEUE_FILE": "/tmp/pravega-sensor-collector-NET1.db",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_PERSISTENT_QUEUE_CAPACITY_EVENTS": "86400",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_PRAVEGA_CONTROLLER_URI": "tcp://localhost:9090",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_SCOPE": "examples",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_CREATE_SCOPE": "true",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_STREAM": "network",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_ROUTING_KEY": "edge-01",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_EXACTLY_ONCE": "true",
    "PRAVEGA_SENSOR_COLLECTOR_NET1_TRANSACTION_TIMEOUT_MINUTES": "10080",
}


def load(environ: dict, path: Path | None = None, tmp: Path = Path("/tmp/h")):
    return load_settings(path, environ, "embedded:/default/streams", tmp)


def test_the_example_file_is_valid(tmp_path):
    config = load_settings(EXAMPLE, {}, "embedded:/unused", tmp_path)
    by_name = {i.name: i for i in config.instances}
    assert sorted(by_name) == ["accel1", "files1", "gen1", "mqtt1", "net1"]
    net = by_name["net1"]
    assert (net.driver, net.stream, net.store) == (
        "nic",
        "examples/network",
        "embedded:/var/lib/sluice/streams",
    )
    assert net.options.interface == "eth0"
    assert net.options.statistics == ("rx_bytes", "tx_bytes")
    assert net.buffer_file == Path("/var/lib/sluice/collector/net1.db")
    assert by_name["files1"].options.table.kind == "csv"
    assert by_name["mqtt1"].options.topics == ("sensors/#",)
    assert config.drain_timeout_seconds == 30


def test_reference_environment_variables_work_unchanged():
    config = load(REFERENCE_NETWORK_ENV)
    (net,) = config.instances
    assert net.name == "NET1"
    assert net.driver == "nic"
    assert net.stream == "examples/network"
    assert net.store == "tcp://localhost:9090"
    assert net.routing_key == "edge-01"
    assert net.samples_per_event == 1000
    assert net.capacity_events == 86400
    assert net.buffer_file == Path("/tmp/pravega-sensor-collector-NET1.db")
    assert net.txn_lease_seconds == 10080 * 60
    assert net.options.interface == "ens33"
    assert net.options.samples_per_sec == 1000.0
    # accepted, without effect here, and said so
    assert any("MEMORY_QUEUE_CAPACITY_ELEMENTS ignored" in n for n in config.notes)
    assert any("CREATE_SCOPE ignored" in n for n in config.notes)


def test_shared_variables_apply_to_every_instance_and_own_ones_win():
    env = {
        "PRAVEGA_SENSOR_COLLECTOR_PRAVEGA_CONTROLLER_URI": "tcp://shared:9090",
        "PRAVEGA_SENSOR_COLLECTOR_SCOPE": "site",
        "PRAVEGA_SENSOR_COLLECTOR_GEN1_CLASS": "generator",
        "PRAVEGA_SENSOR_COLLECTOR_GEN1_STREAM": "one",
        "PRAVEGA_SENSOR_COLLECTOR_GEN_2_CLASS": "generator",
        "PRAVEGA_SENSOR_COLLECTOR_GEN_2_STREAM": "two",
        "PRAVEGA_SENSOR_COLLECTOR_GEN_2_PRAVEGA_CONTROLLER_URI": "embedded:/own",
        "PRAVEGA_SENSOR_COLLECTOR_GEN_2_SAMPLES_PER_SEC": "5",
    }
    config = load(env)
    one, two = config.instances
    assert (one.name, one.stream, one.store) == ("GEN1", "site/one", "tcp://shared:9090")
    assert (two.name, two.stream, two.store) == ("GEN_2", "site/two", "embedded:/own")
    assert two.options.samples_per_sec == 5.0
    assert one.txn_lease_seconds == DEFAULT_TXN_LEASE_SECONDS


def test_environment_overrides_the_same_instance_in_the_file(write_config):
    path = write_config({"gen1": {"driver": "generator", "stream": "a/b", "samples_per_sec": 10}})
    env = {
        "PRAVEGA_SENSOR_COLLECTOR_GEN1_CLASS": "generator",
        "PRAVEGA_SENSOR_COLLECTOR_GEN1_SAMPLES_PER_SEC": "20",
    }
    (gen,) = load(env, path).instances
    assert (gen.name, gen.stream, gen.options.samples_per_sec) == ("gen1", "a/b", 20.0)


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        (
            {"driver": "io.pravega.sensor.collector.leap.LeapDriver", "stream": "a/b"},
            "collector config: instance x: instances.x.driver = "
            "'io.pravega.sensor.collector.leap.LeapDriver' is not a known driver class; use one "
            "of nic, accelerometer, files, mqtt, generator",
        ),
        (
            {"driver": "nic", "stream": "a/b"},
            "collector config: instance x (nic): interface is required but not set",
        ),
        (
            {"driver": "generator", "stream": "a/b", "samples_per_sec": -5},
            "collector config: instance x (generator): instances.x.samples_per_sec = -5 must be "
            "greater than 0",
        ),
        (
            {"driver": "generator", "stream": "a/b", "sample_per_sec": 5},
            "collector config: instance x (generator): unknown setting instances.x.sample_per_sec",
        ),
        (
            {"driver": "generator", "stream": "a/b", "samples_per_event": "many"},
            "instances.x.samples_per_event = 'many' is not a whole number",
        ),
        (
            {"driver": "generator", "stream": "no-scope"},
            "instances.x.stream = 'no-scope' is not a valid stream name (expected SCOPE/STREAM)",
        ),
        (  # as the file spells it, not Python's `True`
            {"driver": "generator", "stream": "a/b", "samples_per_sec": True},
            "instances.x.samples_per_sec = true is not a number",
        ),
        (
            {"driver": "files", "stream": "a/b", "directories": ["/tmp"], "when_full": "shed"},
            "instances.x.when_full = 'shed' cannot be shed for files; files wait on disk",
        ),
        (
            {"driver": "mqtt", "stream": "a/b", "topics": ["a/#/b"]},
            "instances.x.topics = ['a/#/b'] has an invalid topic filter 'a/#/b'",
        ),
        (  # paho refuses these on its network thread: the driver would wait for nothing
            {"driver": "mqtt", "stream": "a/b", "topics": ["sensors#"]},
            "instances.x.topics = ['sensors#'] has an invalid topic filter 'sensors#'",
        ),
        (
            {"driver": "mqtt", "stream": "a/b", "topics": ["a/b", ""]},
            "instances.x.topics = ['a/b', ''] has an invalid topic filter ''",
        ),
        (
            {"driver": "mqtt", "stream": "a/b", "topics": ["t"], "qos": 0},
            "instances.x.qos = 0 must be 1 or 2",
        ),
    ],
)
def test_bad_settings_are_one_clear_error(write_config, instance, message):
    path = write_config({"x": instance})
    with pytest.raises(ConfigError, match=re.escape(message)):
        load({}, path)


def test_bad_environment_is_one_clear_error():
    env = {
        "PRAVEGA_SENSOR_COLLECTOR_X_CLASS": "io.example.Nope",
        "PRAVEGA_SENSOR_COLLECTOR_X_STREAM": "a/b",
    }
    with pytest.raises(
        ConfigError,
        match=re.escape("PRAVEGA_SENSOR_COLLECTOR_X_CLASS = 'io.example.Nope' is not a known"),
    ):
        load(env)
    negative = {
        "PRAVEGA_SENSOR_COLLECTOR_G_CLASS": "generator",
        "PRAVEGA_SENSOR_COLLECTOR_G_STREAM": "a/b",
        "PRAVEGA_SENSOR_COLLECTOR_G_SAMPLES_PER_SEC": "-1",
    }
    with pytest.raises(
        ConfigError,
        match=re.escape("PRAVEGA_SENSOR_COLLECTOR_G_SAMPLES_PER_SEC = '-1' must be greater than 0"),
    ):
        load(negative)
    both = {
        "PRAVEGA_SENSOR_COLLECTOR_G_CLASS": "generator",
        "PRAVEGA_SENSOR_COLLECTOR_G_STREAM": "a/b",
        "PRAVEGA_SENSOR_COLLECTOR_G_DATABASE_FILE": "/tmp/a.db",
        "PRAVEGA_SENSOR_COLLECTOR_G_PERSISTENT_QUEUE_FILE": "/tmp/b.db",
    }
    with pytest.raises(ConfigError, match="both set buffer_file"):
        load(both)
    orphan = {"PRAVEGA_SENSOR_COLLECTOR_SCOPE": "x"}
    with pytest.raises(
        ConfigError, match=re.escape("no PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_CLASS")
    ):
        load(orphan)


def test_nothing_configured_says_how_to_configure():
    with pytest.raises(ConfigError, match=re.escape("no collector instances are configured")):
        load({})


def test_a_stream_name_refused_says_its_rule_once(write_config):
    path = write_config({"x": {"driver": "generator", "stream": "no-scope"}})
    with pytest.raises(ConfigError) as refused:
        load({}, path)
    assert str(refused.value).count("SCOPE/STREAM") == 1


def test_two_instances_cannot_share_a_buffer(write_config):
    path = write_config(
        {
            "a": {"driver": "generator", "stream": "a/b", "buffer_file": "/tmp/same.db"},
            "b": {"driver": "generator", "stream": "a/c", "buffer_file": "/tmp/same.db"},
        }
    )
    with pytest.raises(ConfigError, match="is also the buffer of instance a"):
        load({}, path)


def _one_error_line(result) -> str:
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sluice: error: ")
    return lines[0]


def test_sluice_collect_reports_a_bad_config_in_one_line_at_start_up(write_config, tmp_path):
    unknown = write_config({"x": {"driver": "io.example.Nope", "stream": "a/b"}})
    line = _one_error_line(run_cli("collect", "--config", str(unknown)))
    assert "instances.x.driver = 'io.example.Nope' is not a known driver class" in line

    negative = write_config({"x": {"driver": "generator", "stream": "a/b", "samples_per_sec": -1}})
    line = _one_error_line(run_cli("collect", "--config", str(negative)))
    assert "instances.x.samples_per_sec = -1 must be greater than 0" in line

    missing = write_config({"x": {"driver": "nic", "stream": "a/b", "interface": "nosuch9"}})
    line = _one_error_line(run_cli("collect", "--config", str(missing)))
    assert "instance x (nic): network interface 'nosuch9' not found" in line
    assert "interfaces here:" in line and "lo" in line
    assert not (tmp_path / "state" / "x.db").exists()  # nothing started


def test_sluice_collect_reads_reference_variables_and_reports_their_names(tmp_path):
    env = {
        "PRAVEGA_SENSOR_COLLECTOR_NET1_CLASS": "io.pravega.sensor.collector.network.NetworkDriver",
        "PRAVEGA_SENSOR_COLLECTOR_NET1_SCOPE": "examples",
        "PRAVEGA_SENSOR_COLLECTOR_NET1_STREAM": "network",
        "PRAVEGA_SENSOR_COLLECTOR_NET1_SAMPLES_PER_SEC": "-3",
    }
    line = _one_error_line(run_cli("collect", env=env, cwd=tmp_path))
    assert (
        "instance NET1 (nic): interface (PRAVEGA_SENSOR_COLLECTOR_NET1_NETWORK_INTERFACE) "
        "is required but not set" in line
    )


def test_resolve_of_an_instance_not_configured_names_the_file_and_its_instances(
    write_config, tmp_path
):
    path = write_config({"a": {"driver": "generator", "stream": "a/b"}})
    env = {"SLUICE_HOME": str(tmp_path / "home")}
    line = _one_error_line(run_cli("collect", "resolve", "nosuch", "--config", str(path), env=env))
    assert line == f"sluice: error: collector config: {path}: no instance nosuch; its instances: a"
    empty = tmp_path / "empty"  # no collector.toml here
    empty.mkdir()
    nothing = _one_error_line(run_cli("collect", "status", env=env, cwd=empty))
    assert "collector config: no config file, no environment: no collector instances" in nothing


def test_a_config_that_is_a_directory_is_one_line(tmp_path):
    line = _one_error_line(run_cli("collect", "--config", str(tmp_path)))
    assert line == (
        f"sluice: error: collector config: {tmp_path}: is a directory, not a configuration"
        " file; pass --config FILE.toml"
    )
