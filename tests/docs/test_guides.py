"""Every shell block of the guides in docs/ runs, in order, against a fresh $SLUICE_HOME.

The convention is in docs/README.md and tests/docs/guides.py. The guides that run Spark jobs
make this slow (a Spark session per command): `test_guide` is marked `slow`; the tests of
the runner itself are fast."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.docs import guides

#: The guides that have commands (the reference and the architecture have none to run).
GUIDES = [g for g in sorted(guides.DOCS.glob("*.md")) if guides.steps(g)]


def test_the_guides_with_commands_are_found():
    assert {g.name for g in GUIDES} >= {
        "analysts.md",
        "data-engineers.md",
        "operators.md",
        "replays.md",
    }


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_guide(guide, tmp_path):
    outcome = guides.run(guide, tmp_path / "home", timeout=840)
    if log_dir := os.environ.get("SLUICE_TEST_DOCS_LOG"):  # what a reader would have seen
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        (Path(log_dir) / f"{guide.stem}.log").write_text(outcome.output)
    if outcome.returncode != 0:
        pytest.fail(guides.describe(outcome, guide), pytrace=False)


def _write(tmp_path, text):
    path = tmp_path / "guide.md"
    path.write_text(textwrap.dedent(text))
    return path


def test_steps_follow_the_convention(tmp_path):
    guide = _write(
        tmp_path,
        """\
        # A guide

        ```console
        $ echo one
        one
        $ echo two \\
            three
        two three
        ```

        ```sh
        x=1
        echo "$x"
        ```

        <!-- not run: a service -->
        ```console
        $ sleep 1000
        ```

        ```python
        print("not shell")
        ```
        """,
    )
    found = guides.steps(guide)
    assert [(s.line, s.text) for s in found] == [
        (4, "echo one"),
        (6, "echo two \\\n    three"),
        (12, 'x=1\necho "$x"'),
    ]


def test_a_failing_command_is_named_with_its_line_and_output(tmp_path):
    guide = _write(
        tmp_path,
        """\
        ```console
        $ export GREETING=hello
        $ echo "$GREETING from the first block"
        ```

        ```console
        $ echo "said before failing" && false
        $ echo never
        ```
        """,
    )
    outcome = guides.run(guide, tmp_path / "home", timeout=60)
    assert outcome.returncode == 1
    assert outcome.failed is not None and outcome.failed.line == 7
    assert outcome.output == "said before failing\n"
    message = guides.describe(outcome, guide)
    assert "line 7" in message and "said before failing" in message


def test_the_reader_gets_a_fresh_home_and_this_checkouts_sluice(tmp_path, monkeypatch):
    guide = _write(
        tmp_path,
        """\
        ```sh
        test "$SLUICE_HOME" = "$EXPECTED_HOME"
        sluice store create docs/check
        sluice store list | grep -qx docs/check
        ```
        """,
    )
    home = tmp_path / "home"
    monkeypatch.setenv("EXPECTED_HOME", str(home))
    monkeypatch.setenv("SLUICE_STORE", "embedded:/nonexistent/not-the-readers")
    outcome = guides.run(guide, home, timeout=120)
    assert outcome.returncode == 0, guides.describe(outcome, guide)
    assert (home / "streams").is_dir()
