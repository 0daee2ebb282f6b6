"""Instance settings with an upper limit: a value above it (a typo, an extra 000) is refused at
start-up, naming the setting and the limit, instead of filling memory or failing for ever."""

from __future__ import annotations

import re

import pytest

from collectors.errors import ConfigError


def gen(**extra: object) -> dict:
    return {"driver": "generator", "stream": "lab/gen"} | extra


@pytest.mark.parametrize(
    ("key", "value", "limit"),
    [
        ("samples_per_event", 5_000_000_000, "100,000"),  # the drivers hold an event in memory
        ("capacity_events", 10**12, "100,000,000"),
        ("max_events_per_txn", 10**9, "100,000"),
        ("max_txn_bytes", 2**40, "1,073,741,824"),  # the sender holds a transaction
        ("linger_ms", 10**12, "3,600,000"),  # nothing sent for 30 years
        ("segments", 5000, "1,024"),  # the store refused it at each retry, for ever
        ("txn_lease_seconds", 1e300, "315,360,000"),  # overflowed the store's nanoseconds
        ("transaction_timeout_minutes", 1e12, "5,256,000"),
    ],
)
def test_a_setting_above_its_limit_is_refused_naming_it(make_config, key, value, limit):
    expected = f"instances.gen.{key} = {value!r} is above the limit of {limit}"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        make_config({"gen": gen(**{key: value})})


def test_a_limit_from_the_environment_names_its_variable(make_config):
    environ = {
        "PRAVEGA_SENSOR_COLLECTOR_G1_CLASS": "generator",
        "PRAVEGA_SENSOR_COLLECTOR_G1_STREAM": "lab/g1",
        "PRAVEGA_SENSOR_COLLECTOR_G1_SAMPLES_PER_EVENT": "99999999999999999999",
    }
    expected = "PRAVEGA_SENSOR_COLLECTOR_G1_SAMPLES_PER_EVENT = '99999999999999999999' is above"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        make_config({}, environ=environ)


def test_values_at_the_limits_are_taken(make_config):
    table = gen(samples_per_event=100_000, segments=1024, txn_lease_seconds=315_360_000)
    inst = make_config({"gen": table}).instances[0]
    assert (inst.samples_per_event, inst.segments) == (100_000, 1024)
