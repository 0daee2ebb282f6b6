"""Stores by name, paths under the home (issue 12): every `--store`/`--to-store` takes a store's
name in sluice.toml or a URI, resolved in one place; a relative embedded directory or output
given on the command line is under $SLUICE_HOME, where sluice.toml's stores and exports are
(so `sluice sql` finds what `sluice run export --output exports/network` wrote)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.cli import build_parser, resolve_stores
from pipeline.cli.run import job_spec
from pipeline.config import StoreUriError
from pipeline.settings import SettingsError, UnknownStore, store_uri
from pipeline.streams import open_store

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repository_config(monkeypatch, tmp_path):
    monkeypatch.setenv("SLUICE_CONFIG", str(REPO / "sluice.toml"))
    monkeypatch.chdir(tmp_path)  # a working directory that is not the home


def parsed(argv: list[str]):
    return resolve_stores(build_parser(cli.chosen_command(argv)).parse_args(argv))


def test_a_store_name_and_a_relative_embedded_uri_are_the_same_store(
    _sluice_home, tmp_path, capsys
):
    assert cli.main(["--store", "cloud", "store", "create", "site/a"]) == 0
    assert cli.main(["--store", "embedded:cloud", "store", "create", "site/b"]) == 0
    with open_store(f"embedded:{_sluice_home / 'cloud'}") as cloud:
        assert cloud.list_streams("site") == ["site/a", "site/b"]
    assert not (tmp_path / "cloud").exists()  # not the working directory
    assert cli.main(["--store", "cloud", "store", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["site/a", "site/b"]


def test_every_store_option_takes_a_name(_sluice_home, settings):
    mirror = ["run", "mirror", "--stream", "a/b", "--to", "c/d", "--to-store", "cloud"]
    args = parsed(["--store", "edge", *mirror])
    spec = job_spec(args)
    assert (spec.store, spec.to_store) == (settings.stores["edge"], settings.stores["cloud"])
    assert spec.to_store == f"embedded:{_sluice_home / 'cloud'}"


def test_a_store_name_follows_its_environment_override(monkeypatch):
    monkeypatch.setenv("SLUICE_STORE_CLOUD", "pravega://cloud:9090")
    assert parsed(["--store", "cloud", "store", "list"]).store == "pravega://cloud:9090"


def test_a_relative_output_is_under_the_home_where_sluice_sql_looks(_sluice_home, settings):
    args = parsed(
        ["run", "export", "--stream", "examples/network", "--schema", "NetworkSamples",
         "--output", "exports/network"]
    )  # fmt: skip
    assert job_spec(args).output == settings.family("network").export_dir
    assert job_spec(args).output == _sluice_home / "exports" / "network"
    absolute = parsed(["run", "export", "--stream", "a/b", "--schema", "S", "--output", "/srv/x"])
    assert job_spec(absolute).output == Path("/srv/x")


def test_the_collector_takes_a_store_name(_sluice_home, tmp_path):
    from pipeline.cli.collect import _load

    config = tmp_path / "collector.toml"
    config.write_text('[instances.g]\ndriver = "generator"\nstream = "a/b"\n')
    settings = _load(parsed(["--store", "cloud", "collect", "--config", str(config)]))
    assert settings.instances[0].store == f"embedded:{_sluice_home / 'cloud'}"


def test_an_unknown_store_name_is_refused_naming_the_known_ones(capsys):
    expected = "--store 'clod' is neither a store URI (embedded:<dir>, pravega://host:9090) nor"
    with pytest.raises(UnknownStore, match=re.escape(expected)):
        store_uri("clod")
    assert cli.main(["--store", "clod", "store", "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("sluice.toml (known: cloud, edge)")  # the mistake is not the file's
    assert "fix it" not in err


@pytest.mark.parametrize("uri", ["ftp://x", "pravega:", "embedded"])
def test_a_text_that_is_no_store_is_refused(uri, capsys):
    with pytest.raises((StoreUriError, SettingsError, UnknownStore)):
        store_uri(uri, "--to-store")
    assert cli.main(["run", "mirror", "--stream", "a/b", "--to", "c/d", "--to-store", uri]) == 1
    assert "--to-store" in capsys.readouterr().err
