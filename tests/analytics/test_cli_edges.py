"""`sluice plot rates` and `sluice analytics refresh --export` as a user meets them: how many
points `--max-points` draws, an export known only from `refresh --export`, and an export
directory that is missing or no directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.analytics.sources import AnalyticsPaths
from pipeline.settings import load_settings
from tests.analytics.conftest import T0, nic_rows, write_export

SECOND = 1_000_000_000


def nic_export(root: Path, samples: int, hosts: tuple[str, ...] = ("edge1",)) -> Path:
    """`samples` samples a second apart per host, in the export job's layout."""
    times = [T0 + i * SECOND for i in range(samples)]
    rows = []
    for host in hosts:
        rows += nic_rows(host, "eth0", times, [125_000 * i for i in range(samples)], [0] * samples)
    return write_export(root, rows)


def plotted(capsys, *argv: str) -> str:
    assert cli.main(["plot", "rates", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.strip()


# --- plot rates --max-points ----------------------------------------------------------------


@pytest.mark.parametrize("given", ["-3", "0", "1", "two"])
def test_max_points_below_two_is_refused_by_the_parser(capsys, given):
    with pytest.raises(SystemExit) as done:
        cli.main(["plot", "rates", "examples/network", f"--max-points={given}"])
    assert done.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("sluice plot rates: error: argument --max-points: ")
    assert err.endswith("the most points to draw: 2 or more")


@pytest.mark.parametrize(
    ("hosts", "max_points", "points"),
    [
        (("edge1",), 2, 2),  # a start and an end: 2 meant 1 point
        (("edge1",), 3, 3),
        (("edge1",), 7, 7),
        (("edge1", "edge2"), 4, 4),  # shared among the NICs: 2 each
        (("edge1", "edge2"), 5, 4),
        (("edge1", "edge2", "edge3"), 2, 3),  # one per NIC at the least
        (("edge1",), 100, 29),  # fewer samples: every rate (the first sample has none)
    ],
)
def test_max_points_is_the_most_points_drawn(capsys, tmp_path, hosts, max_points, points):
    root = nic_export(tmp_path / "network", 30, hosts)
    assert cli.main(["analytics", "refresh", "--export", f"examples/network={root}"]) == 0
    capsys.readouterr()
    out = tmp_path / "rates.png"
    argv = ["examples/network", "-o", str(out), "--max-points", str(max_points)]
    samples = 30 * len(hosts)
    assert plotted(capsys, *argv) == f"wrote {out} ({points} points from {samples} samples)"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- plot rates of an export only `refresh --export` names ----------------------------------


def test_plot_finds_an_export_that_refresh_export_included(capsys, tmp_path):
    """The refusal said to run `sluice analytics refresh --export NAME=DIR`; after it, the
    plot still said no export of it was known, though `sluice sql` read its rates."""
    root = nic_export(tmp_path / "somewhere" / "network", 10)
    out = tmp_path / "n.png"
    assert cli.main(["plot", "rates", "examples/network", "-o", str(out)]) == 1
    advice = "include its directory with `sluice analytics refresh --export examples/network=DIR`"
    assert advice in capsys.readouterr().err
    assert cli.main(["analytics", "refresh", "--export", f"examples/network={root}"]) == 0
    capsys.readouterr()
    assert cli.main(["sql", "SELECT count(*) AS n FROM rates", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"n": 10}
    got = plotted(capsys, "examples/network", "-o", str(out))
    assert got == f"wrote {out} (9 points from 10 samples)"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_finds_a_refreshed_export_by_its_stream_when_it_was_renamed(capsys, tmp_path):
    """`x/net` after `x/Net` would share its view (DuckDB ignores case), so the refresh names
    it after its directory (`x/net/other`): its stream still finds it."""
    first = nic_export(tmp_path / "a" / "network", 4)
    second = nic_export(tmp_path / "b" / "other", 6)
    argv = ["analytics", "refresh", "--export", f"x/Net={first}"]
    assert cli.main([*argv, "--export", f"x/net={second}"]) == 0
    assert "export:   x/net/other <- " in capsys.readouterr().out
    for name, samples in (("x/net", 6), ("x/net/other", 6), ("x/Net", 4)):
        got = plotted(capsys, name, "-o", str(tmp_path / "o.png"))
        assert got.endswith(f"({samples - 1} points from {samples} samples)"), name


def test_an_export_unknown_anywhere_is_refused_naming_the_known_ones(capsys, tmp_path):
    root = nic_export(tmp_path / "network", 4)
    assert cli.main(["analytics", "refresh", "--export", f"examples/network={root}"]) == 0
    capsys.readouterr()
    assert cli.main(["plot", "rates", "examples/nothing"]) == 1
    assert capsys.readouterr().err == (
        "sluice: error: cannot plot examples/nothing: no export of it is known (known: "
        "examples/network); export it with `sluice run export`, or include its directory "
        "with `sluice analytics refresh --export examples/nothing=DIR`\n"
    )


# --- analytics refresh --export DIR ---------------------------------------------------------


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_an_export_directory_that_is_not_one_is_refused_and_nothing_refreshed(
    capsys, tmp_path, what
):
    directory = tmp_path / "nosuchdir"
    if what == "a file":
        directory.write_text("not an export\n")
    found = "does not exist" if what == "missing" else "is not a directory"
    option = f"examples/x={directory}"
    assert cli.main(["analytics", "refresh", "--export", option]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == (
        "",
        f"sluice: error: --export {option!r}: {directory} {found}: give the directory an "
        "export writes to (the --output of `sluice run export`)\n",
    )
    assert not AnalyticsPaths.from_settings(load_settings()).database.exists()
