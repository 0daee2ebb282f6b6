"""sluice.toml is read into typed settings; every mistake is one SettingsError naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.config import ConfigFileError, EnvironmentVariableError
from pipeline.errors import SluiceError
from pipeline.settings import BUNDLED_SCHEMAS_DIR, SettingsError, load_settings

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
            "Expected `int`, got `str` - at `streams.net.segments`",
        ),
        (
            ('schema = "NetworkSamples"', 'schema = "NetworkSamples"\ncolour = 1'),
            "unknown field `colour` - at `streams.net`",
        ),
        (('models = ["m"]', 'models = ["nope"]'), "streams.net.models names nope"),
        (('stream = "site/network"', 'stream = "site/network"\nstore = "moon"'), "'moon'"),
        (('stream = "examples/network"', 'stream = "../escape"'), "streams.net.stream"),
        (('function = "pkg.mod:fn"', 'function = "pkg.mod.fn"'), "is not `module:function`"),
        (("[streams.net.bookmark]\nburst_mbps = 1.0", ""), "add [streams.net.bookmark]"),
        (
            ('schema = "NetworkSamples"', 'schema = "NetworkSample"'),
            "streams.net.schema = 'NetworkSample' is neither a bundled schema "
            "(AccelerometerSamples, GeneratorSamples, NetworkSamples) nor an .avsc file",
        ),
        (("[models.m]", "[models.m]\ncolour = 1"), "unknown field `colour` - at `models.m`"),
        (('embedded = "cloud"', 'uri = "ftp://x"'), "stores.cloud.uri: 'ftp://x' is not a store"),
        (
            ('[streams.net.mirror]\nstream = "site/network"\n', ""),
            "`streams.net.mirror` is required and missing",
        ),
        (('stream = "site/network"', 'store = "cloud"'), "`streams.net.mirror.stream` is required"),
        (('function = "pkg.mod:fn"', "params = {a = 1}"), "`models.m.function` is required"),
    ],
)
def test_mistakes_name_the_key(tmp_path, edit, message):
    old, new = edit
    assert old in MINIMAL
    text = MINIMAL.replace(old, new)
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(write(tmp_path, text), environ={}, home=tmp_path)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            '[streams.net2]\nstream = "examples/other"\nschema = "NetworkSamples"\n'
            '[streams.net2.mirror]\nstream = "site/network"\n',
            "streams.net and streams.net2 are both mirrored into 'site/network' of one store",
        ),
        (
            '[streams.loop]\nstream = "a/s"\nschema = "NetworkSamples"\n'
            '[streams.loop.mirror]\nstore = "edge"\nstream = "a/s"\n',
            "streams.loop.mirror.stream = 'a/s' in the same store is the stream itself",
        ),
    ],
    ids=["two families, one mirror stream", "a family mirrored into itself"],
)
def test_mirrors_that_would_read_their_own_or_anothers_events_are_refused(tmp_path, extra, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings(write(tmp_path, MINIMAL + extra), environ={}, home=tmp_path)


def test_unknown_family_is_refused(settings):
    known = "no [streams.nope] (known: generator, network)"
    with pytest.raises(SettingsError, match=re.escape(known)):
        settings.family("nope")


# --- issue 13: configuration errors name the file and line, or the variable ------------------


def test_a_toml_syntax_error_names_the_file_and_line(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, "[stores.cloud]\nembedded = 'cloud'\n[streams.net\nstream = 'a/b'\n")
    expected = f"{path}, line 3: not valid TOML: Expected ']' at the end of a table declaration"
    with pytest.raises(ConfigFileError, match=re.escape(expected)):
        load_settings(path, environ={}, home=tmp_path)
    monkeypatch.setenv("SLUICE_CONFIG", str(path))
    assert cli.main(["store", "list"]) == 1
    assert (
        capsys.readouterr().err
        == f"sluice: error: {expected} (column 13); fix the syntax and retry\n"
    )


def test_a_missing_sluice_config_file_is_an_error(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nope.toml"
    monkeypatch.setenv("SLUICE_CONFIG", str(missing))
    with pytest.raises(ConfigFileError, match=re.escape(f"{missing}: no such configuration file")):
        load_settings(environ={})
    assert cli.main(["slices", "list", "a/b"]) == 1
    assert capsys.readouterr().err.startswith(f"sluice: error: {missing}: no such configuration")


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ('[stores.edge]\nembeded = "elsewhere"\n', ["store", "list"]),  # else the default store
        ('[streams.x]\nstreem = "a/b"\n', ["slices", "list", "a/b"]),
        ("[checks]\nquarantine_rate_maximum = 0.1\n", ["store", "create", "a/b"]),
    ],
)
def test_every_command_checks_the_whole_file_first(tmp_path, monkeypatch, capsys, text, command):
    """A misspelt key is one error naming it, whatever the command: the store commands once
    read only the part they needed, and went on without the misspelt setting."""
    monkeypatch.setenv("SLUICE_CONFIG", str(write(tmp_path, text)))
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    assert cli.main(command) == 1
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: ") and "unknown field" in err and err.count("\n") == 1
    assert not (tmp_path / "home").exists()  # nothing done
    assert cli.main(["completion", "bash"]) == 0  # a command that reads no sluice.toml


def test_no_sluice_toml_in_the_working_directory_is_an_empty_configuration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLUICE_CONFIG", raising=False)
    assert load_settings(environ={}, home=tmp_path).streams == ()


@pytest.mark.parametrize("variable", ["SLUICE_CHECKS_NOPE", "SLUICE_STROE", "SLUICE_EXPORTS_DIRS"])
def test_an_unknown_sluice_variable_is_an_error_naming_it(tmp_path, monkeypatch, capsys, variable):
    path = write(tmp_path, MINIMAL)
    with pytest.raises(
        EnvironmentVariableError,
        match=re.escape(f"environment variable {variable}: is not a variable Sluice reads"),
    ):
        load_settings(path, environ={variable: "1"}, home=tmp_path)
    monkeypatch.setenv(variable, "1")
    assert cli.main(["store", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sluice: error: environment variable {variable}: is not a variable")
    assert "sluice.toml:" not in err


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "SLUICE_CHECKS_QUARANTINE_RATE_MAX",
            "lots",
            "'lots' does not fit [checks] quarantine_rate_max",
        ),
        ("SLUICE_DAGSTER_TAIL_SENSOR_INTERVAL_SECONDS", "1.5", "does not fit [dagster]"),
        ("SLUICE_EXPORTS_FORMATS", "parquet,xml", "exports.formats names xml"),
        ("SLUICE_STORE_CLOUD", "ftp://x", "'ftp://x' is not a store URI"),
        ("SLUICE_STORE", "cloud", "'cloud' is not a store URI"),
    ],
)
def test_a_bad_value_in_a_variable_names_the_variable(tmp_path, variable, value, message):
    path = write(tmp_path, MINIMAL)
    with pytest.raises(SluiceError, match=re.escape(message)) as caught:
        load_settings(path, environ={variable: value}, home=tmp_path)
    assert variable in str(caught.value)
    assert str(path) not in str(caught.value)


def test_known_variables_are_accepted(tmp_path):
    env = {
        "SLUICE_HOME": str(tmp_path),
        "SLUICE_SPARK_MASTER": "local[1]",
        "SLUICE_PRAVEGA_RPC_TIMEOUT": "3",
        "SLUICE_TEST_PRAVEGA": "tcp://127.0.0.1:9090",
        "SLUICE_GROUP_READ": "1",
        "SLUICE_STORE_ARCHIVE": "embedded:archive",
    }
    s = load_settings(write(tmp_path, MINIMAL), environ=env, home=tmp_path / "home")
    assert s.stores["archive"] == f"embedded:{tmp_path / 'home' / 'archive'}"


def test_settings_see_the_same_bundled_schemas_as_pipeline_schemas():
    from pipeline.schemas import bundled_schemas

    assert tuple(sorted(p.stem for p in BUNDLED_SCHEMAS_DIR.glob("*.avsc"))) == bundled_schemas()


def test_an_avsc_file_is_a_schema(tmp_path):
    avsc = tmp_path / "Mine.avsc"
    avsc.write_text("{}")
    text = MINIMAL.replace('schema = "NetworkSamples"', f'schema = "{avsc}"')
    assert load_settings(write(tmp_path, text), environ={}, home=tmp_path).family(
        "net"
    ).schema == str(avsc)


def test_zero_segments_on_the_command_line_is_a_clear_error(tmp_path, capsys, store_dir):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--store", f"embedded:{store_dir}", "store", "create", "a/b", "--segments", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith("error: argument --segments: 0: a stream has 1 to 1024 segments\n")
    assert "Traceback" not in err
    assert not store_dir.exists()  # nothing created


def test_a_home_or_config_given_with_a_tilde_is_under_the_users_home(monkeypatch, tmp_path):
    """An env file (docker, systemd) passes `~` on unexpanded: it named `./~/x`."""
    from pipeline.config import config_path, sluice_home

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SLUICE_HOME", "~/sluice-home")
    monkeypatch.setenv("SLUICE_CONFIG", "~/conf/sluice.toml")
    assert sluice_home() == tmp_path / "sluice-home"
    assert config_path() == tmp_path / "conf" / "sluice.toml"
