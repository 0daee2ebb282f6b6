"""Routing keys at the edges: what the store holds, what a name built from keys or columns
becomes, and what each place a person types a key (a series, a mirror's fixed key, a
collector's setting) accepts or refuses, and why."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from collectors.errors import ConfigError
from pipeline.jobs.mirror import MirrorSpec
from pipeline.jobs.stream_join import SeriesSource
from pipeline.schemas.sensors import sensor_name, sensor_names
from pipeline.spark.errors import OptionError
from pipeline.spark.options import SinkOptions
from pipeline.streams import InvalidRoutingKey
from tests.collectors.test_settings import REFERENCE_NETWORK_ENV, load

#: Keys a store must keep apart and give back as written (None: no key).
KEYS = [
    None,
    "",
    "a" * 1024,
    "é" * 512,  # 1024 bytes in UTF-8
    "a#b",
    "a/b",
    "a,b",
    "a=b",
    "a:b",
    "a b",
    " a ",
    "q\"u'o",
    "a\nb",
    "a\x00b",
    "😀",
    "K",
    "k",
    "\u00e9",  # é as one code point
    "e\u0301",  # e and a combining acute accent
]
SURROGATE = "edge\udcff01"  # what Python makes of the bytes b"edge\xff01" in argv or environ


def test_every_key_comes_back_exactly_as_written_and_apart_from_the_others(store):
    store.create_stream("s/keys", segments=3)
    writer = store.writer("s/keys")
    for i, key in enumerate(KEYS):
        writer.write(str(i).encode(), key)
    writer.flush()
    txn = store.begin_transaction("s/keys")
    for i, key in enumerate(KEYS):
        txn.write(str(i).encode(), key)
    txn.commit()
    got = sorted((int(e.payload), e.routing_key) for e in store.read("s/keys"))
    assert got == sorted([*enumerate(KEYS), *enumerate(KEYS)])
    reader = store.reader_group("g", "s/keys").reader("r")
    grouped = sorted((int(e.payload), e.routing_key) for e in reader.read(100))
    assert grouped == got


def test_a_key_that_is_no_unicode_text_is_refused_with_a_reason(store):
    store.create_stream("s/keys")
    said = "character 4 is a lone surrogate ('\\udcff'), which is no Unicode text"
    writer = store.writer("s/keys")
    with pytest.raises(InvalidRoutingKey, match=re.escape(said)):
        writer.write(b"x", SURROGATE)
    txn = store.begin_transaction("s/keys")
    with pytest.raises(InvalidRoutingKey, match=re.escape("give the key as valid UTF-8 text")):
        txn.write(b"x", SURROGATE)
    txn.abort()
    assert list(store.read("s/keys")) == []


def test_a_key_over_the_limit_says_how_long_it_is_and_what_to_do(store):
    store.create_stream("s/keys")
    said = "it is 1026 bytes in UTF-8, longer than 1024 bytes: use a shorter key"
    with pytest.raises(InvalidRoutingKey, match=re.escape(said)):
        store.writer("s/keys").write(b"x", "é" * 513)


# --- the streaming join's STREAM#KEY ------------------------------------------------------


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_a_series_names_any_key_and_reads_back_as_it_was_given(key):
    source = SeriesSource("s/x", key)
    assert SeriesSource.parse(source.text) == source


def test_a_series_key_is_everything_after_the_first_hash():
    assert SeriesSource.parse("s/x#a#b") == SeriesSource("s/x", "a#b")
    assert SeriesSource.parse("s/x# k ") == SeriesSource("s/x", " k ")
    assert SeriesSource.parse("s/x#") == SeriesSource("s/x", "")  # the empty key
    assert SeriesSource.parse("s/x") == SeriesSource("s/x", None)  # every event


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("s/x#" + "k" * 1025, "it is 1025 bytes in UTF-8, longer than 1024 bytes"),
        (f"s/x#{SURROGATE}", "is a lone surrogate"),
    ],
)
def test_a_series_key_the_store_cannot_hold_is_refused(text, said):
    with pytest.raises(InvalidRoutingKey, match=re.escape(said)):
        SeriesSource.parse(text)


# --- the mirror's fixed key ---------------------------------------------------------------


def mirror_spec(key: str | None) -> MirrorSpec:
    return MirrorSpec("edge/network", "cloud/network", "embedded:/e", "embedded:/c", key)


@pytest.mark.parametrize(
    ("key", "said"),
    [
        (SURROGATE, "is a lone surrogate"),
        ("s" * 1025, "longer than 1024 bytes"),
    ],
)
def test_a_fixed_key_the_events_would_not_carry_is_refused(key, said):
    with pytest.raises(InvalidRoutingKey, match=re.escape(said)):
        mirror_spec(key)


@pytest.mark.parametrize(
    "key",
    [None, "", "  ", " site-1", "site-1\n", "site 1", "a#b", "-site", "s😀\x00n", "\u00e9"],
    ids=repr,
)
def test_a_fixed_key_is_taken_as_given(key):
    assert mirror_spec(key).fixed_routing_key == key


@pytest.mark.parametrize("key", ["", "  ", " site-1", "site-1\n", "a#b"], ids=repr)
def test_the_sink_takes_its_routing_key_option_as_given(key):
    options = {"stream": "cloud/network", "store": "embedded:/c", "routingKey": key}
    assert SinkOptions.parse(options).routing_key == key
    assert SinkOptions.parse({**options, "routingKey": None}).routing_key is None


def test_a_routing_key_option_the_store_cannot_hold_is_refused():
    options = {"stream": "cloud/network", "store": "embedded:/c", "routingKey": SURROGATE}
    with pytest.raises(OptionError, match="routingKey"):
        SinkOptions.parse(options)


# --- names from columns -------------------------------------------------------------------


def test_sensors_whose_values_hold_the_separator_keep_their_own_names():
    rows = pa.table(
        {
            "RemoteAddr": ["a/b", "a", "x\\", "x", "edge1", None],
            "Interface": ["c", "b/c", "y", "\\y", "eth0", "eth0"],
        }
    )
    names = sensor_names(rows, "RemoteAddr,Interface").to_pylist()
    assert names == ["a\\/b/c", "a/b\\/c", "x\\\\/y", "x/\\\\y", "edge1/eth0", None]
    assert len(set(names)) == len(names)
    assert [sensor_name(v) for v in (["a/b", "c"], ["edge1", "eth0"])] == names[0:5:4]


def test_one_column_names_its_sensors_by_its_values_as_they_are():
    rows = pa.table({"RemoteAddr": ["a/b", "x\\y", "edge1"]})
    assert sensor_names(rows, "RemoteAddr").to_pylist() == ["a/b", "x\\y", "edge1"]
    assert sensor_name(["a/b"]) == "a/b"


# --- the collector's routing_key setting --------------------------------------------------


@pytest.mark.parametrize(
    ("key", "said"),
    [
        (SURROGATE, "is not a routing key: character 4 is a lone surrogate"),
        ("k" * 1025, "is not a routing key: it is 1025 bytes in UTF-8, longer than 1024 bytes"),
    ],
)
def test_a_collector_routing_key_the_store_cannot_hold_is_refused_at_start_up(key, said):
    env = {**REFERENCE_NETWORK_ENV, "PRAVEGA_SENSOR_COLLECTOR_NET1_ROUTING_KEY": key}
    with pytest.raises(ConfigError, match=re.escape(said)):
        load(env)


def test_a_collector_routing_key_of_any_legal_text_is_taken():
    env = {**REFERENCE_NETWORK_ENV, "PRAVEGA_SENSOR_COLLECTOR_NET1_ROUTING_KEY": "e\u0301#1/😀"}
    assert load(env).instances[0].routing_key == "e\u0301#1/😀"
