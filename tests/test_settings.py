"""sluice.toml is read into typed settings; every mistake is one SettingsError naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.settings import SettingsError, load_settings

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sluice.toml"
    path.write_text(text)
    return path


MINIMAL = """
[stores.cloud]
embedded = "cloud"
[models.m]
function = "pkg.mod:fn"
[streams.net]
stream = "examples/network"
schema = "NetworkSamples"
models = ["m"]
[streams.net.mirror]
stream = "site/network"
[streams.net.bookmark]
burst_mbps = 1.0
"""


def test_repository_config_resolves_under_home(settings, _sluice_home):
    net = settings.family("network")
    assert net.store_uri == f"embedded:{_sluice_home / 'streams'}"
    assert net.mirror_store_uri == f"embedded:{_sluice_home / 'cloud'}"
    assert net.export_dir == _sluice_home / "exports" / "network"
    assert net.bookmark is not None and net.bookmark.sensor_by == "RemoteAddr,Interface"
    assert {f.name for f in settings.streams} == {"network", "generator"}
    assert settings.dagster_home == _sluice_home / "dagster"


def test_environment_overrides(tmp_path):
    env = {
        "SLUICE_STORE_CLOUD": "embedded:/elsewhere",
        "SLUICE_CHECKS_QUARANTINE_RATE_MAX": "0.25",
        "SLUICE_EXPORTS_FORMATS": "parquet",
    }
    s = load_settings(write(tmp_path, MINIMAL), environ=env, home=tmp_path / "home")
    assert s.family("net").mirror_store_uri == "embedded:/elsewhere"
    assert s.checks.quarantine_rate_max == 0.25
    assert s.export_formats == ("parquet",)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ('schema = "NetworkSamples"', 'schema = "NetworkSamples"\nsegments = "many"'),
            "Expected `int`, got `str` - at `streams.<name>.segments`",
        ),
        (
            ('schema = "NetworkSamples"', 'schema = "NetworkSamples"\ncolour = 1'),
            "unknown field `colour` - at `streams.<name>`",
        ),
        (('models = ["m"]', 'models = ["nope"]'), "streams.net.models names nope"),
        (('stream = "site/network"', 'stream = "site/network"\nstore = "moon"'), "'moon'"),
        (('stream = "examples/network"', 'stream = "../escape"'), "streams.net.stream"),
        (('function = "pkg.mod:fn"', 'function = "pkg.mod.fn"'), "is not `module:function`"),
        (("[streams.net.bookmark]\nburst_mbps = 1.0", ""), "add [streams.net.bookmark]"),
    ],
)
def test_mistakes_name_the_key(tmp_path, edit, message):
    old, new = edit
    assert old in MINIMAL
    text = MINIMAL.replace(old, new)
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(write(tmp_path, text), environ={}, home=tmp_path)


def test_unknown_family_is_refused(settings):
    known = "no [streams.nope] (known: generator, network)"
    with pytest.raises(SettingsError, match=re.escape(known)):
        settings.family("nope")
