"""The `sluice` command's global options: --version, -v/-q (logging on standard error only)."""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import subprocess

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


@pytest.fixture
def restored_logging():
    """configure_logging changes the root and py4j loggers: put them back after the test."""
    root, py4j = logging.getLogger(), logging.getLogger("py4j")
    before = (root.level, root.handlers[:], py4j.level)
    yield
    root.setLevel(before[0])
    root.handlers[:] = before[1]
    py4j.setLevel(before[2])


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        ({}, set()),
        ({"quiet": True}, set()),
        ({"verbose": 1}, {"INFO"}),
        ({"verbose": 2}, {"INFO"}),  # never py4j's debug lines: they drown Sluice's own
    ],
)
def test_py4j_logs_info_only_when_asked(capsys, restored_logging, flags, shown):
    from pipeline.cli import configure_logging

    args = argparse.Namespace(**{"quiet": False, "verbose": 0, **flags})
    configure_logging(args)
    py4j = logging.getLogger("py4j.clientserver")
    py4j.debug("a debug line")
    py4j.info("Callback Server Starting")
    err = capsys.readouterr().err
    assert {level for level in ("DEBUG", "INFO") if f"{level} py4j" in err} == shown


def test_verbose_and_quiet_together_are_refused(capsys):
    with pytest.raises(SystemExit) as done:
        main(["-v", "-q", "store", "list"])
    assert done.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "given_to"),
    [
        (["store", "write", "a/s", "--key", "k"], "sluice store write"),
        (["store", "--bogus", "list"], "sluice store"),
        (["--bogus", "store", "list"], "sluice"),
        (["store", "list", "scope", "extra"], "sluice store list"),
    ],
)
def test_an_argument_nobody_takes_is_refused_with_the_usage_of_its_command(capsys, argv, given_to):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {given_to} [-h]")
    assert f"\n{given_to}: error: unrecognized arguments: " in err


def complete_in_bash(script: str, line: str) -> list[str]:
    """What bash offers for `line` with the completion script loaded (a real bash)."""
    words = line.split(" ")
    program = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        f'COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}\n'
        '_shtab_sluice; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_offers_commands_actions_and_options(tmp_path, capsys):
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "sluice.bash"
    script.write_text(capsys.readouterr().out)
    assert complete_in_bash(str(script), "sluice st") == ["store"]
    assert complete_in_bash(str(script), "sluice store ve") == ["verify"]
    assert "--segments" in complete_in_bash(str(script), "sluice store create --se")


def test_zsh_completion_is_a_zsh_completion_function(capsys):
    assert main(["completion", "zsh"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#compdef sluice")
    assert "verify" in script


def every_action(parser: argparse.ArgumentParser, path: str = "sluice"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_action(sub, f"{path} {name}")
        elif action.dest != "help" and not isinstance(action, argparse._VersionAction):
            yield path, action, parser


def test_every_argument_has_a_help_line_and_shows_its_default():
    from pipeline.cli import build_parser

    missing, no_default = [], []
    for path, action, parser in every_action(build_parser()):
        name = "/".join(action.option_strings) or action.dest
        if not action.help:
            missing.append(f"{path} {name}")
        elif (
            action.option_strings
            and action.default not in (None, False, [], argparse.SUPPRESS)
            and not isinstance(action, argparse._StoreConstAction)
        ):
            shown = parser._get_formatter()._get_help_string(action)
            if "default" not in shown:
                no_default.append(f"{path} {name}")
    assert missing == []
    assert no_default == []


def test_help_never_mentions_background_documents(capsys):
    from pipeline.cli import build_parser

    for path, action, _ in every_action(build_parser()):
        assert "seed" not in (action.help or "").lower(), path
