"""The `sluice` command's global options: --version, -v/-q (logging on standard error only)."""

from __future__ import annotations

import logging
import re

import pytest

from pipeline.cli import main, sluice_version


def test_version_names_the_installed_distribution(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"sluice {sluice_version()}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", sluice_version())


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        ([], logging.WARNING),
        (["-v"], logging.INFO),
        (["-vv"], logging.DEBUG),
        (["-q"], logging.ERROR),
    ],
)
def test_verbosity_sets_the_log_level_and_logs_go_to_standard_error(
    tmp_path, capsys, monkeypatch, flags, level
):
    store = f"embedded:{tmp_path / 's'}"
    seen: list[int] = []

    def list_and_log(args):
        seen.append(logging.getLogger().level)
        logging.getLogger("sluice.test").error("to stderr")
        return 0

    monkeypatch.setattr("pipeline.cli.store.cmd_list", list_and_log)
    assert main([*flags, "--store", store, "store", "list"]) == 0
    assert seen == [level]
    out, err = capsys.readouterr()
    assert "to stderr" not in out
    assert "ERROR sluice.test: to stderr" in err


def test_verbose_and_quiet_together_are_refused(capsys):
    with pytest.raises(SystemExit) as done:
        main(["-v", "-q", "store", "list"])
    assert done.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
