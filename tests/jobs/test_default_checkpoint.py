"""Two jobs never share a default checkpoint: not because their names read alike (`/d/out a`,
`/d/out.a`, long names with a common tail), nor because they have the same streams in other
stores (one edge stream mirrored to two clouds). A default checkpoint named the former ways
(a hash of the names alone; before that no hash) is still found by the run that made it."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.bookmark import BookmarkSpec, Condition, bookmark_checkpoint
from pipeline.jobs.checkpoint import Checkpoint
from pipeline.jobs.console import ConsoleSpec, console_checkpoint
from pipeline.jobs.export import ExportSpec, export_checkpoint, export_identity
from pipeline.jobs.mirror import MirrorSpec, mirror_checkpoint, mirror_identity
from pipeline.jobs.stream_join import SeriesSource, StreamJoinSpec, join_checkpoint
from pipeline.streams import open_store

T0 = 1_609_362_000_000_000_000


def export_spec(output: str, store: str = "embedded:/s", stream: str = "edge/n") -> ExportSpec:
    return ExportSpec(stream, "NetworkSamples", Path(output), store)


def test_names_that_read_alike_get_their_own_default_checkpoints():
    alike = ["/d/out a", "/d/out[a", "/d/out.a", "d/out a/"]
    roots = {export_checkpoint(export_spec(target)) for target in alike}
    assert len(roots) == len(alike)
    tail = "x" * 130
    assert export_checkpoint(export_spec(f"/a/{tail}")) != export_checkpoint(
        export_spec(f"/b/{tail}")
    )
    longest = export_checkpoint(export_spec("/" + "t" * 250, stream="s/" + "s" * 250))
    assert len(longest.name) <= 255


def test_the_same_streams_in_other_stores_get_their_own_default_checkpoints():
    def mirrors(store: str, to_store: str) -> Path:
        return mirror_checkpoint(MirrorSpec("edge/n", "cloud/n", store, to_store))

    # one edge stream mirrored to two clouds; two edges mirrored alike to two clouds
    assert mirrors("embedded:/e", "embedded:/x") != mirrors("embedded:/e", "embedded:/y")
    assert mirrors("embedded:/e1", "embedded:/x") != mirrors("embedded:/e2", "embedded:/y")
    assert mirrors("embedded:/e1", "embedded:/x") != mirrors("embedded:/e2", "embedded:/x")
    assert mirrors("embedded:/e", "embedded:/x").name.startswith("edge.n--cloud.n-")
    # the same stream of two stores exported, bookmarked, printed, joined
    assert export_checkpoint(export_spec("/out", "embedded:/a")) != export_checkpoint(
        export_spec("/out", "embedded:/b")
    )
    stores, burst = ("embedded:/a", "embedded:/b"), (Condition("burst", value=1.0),)
    marks = [BookmarkSpec("cloud/n", "NetworkSamples", s, burst) for s in stores]
    assert bookmark_checkpoint(marks[0]) != bookmark_checkpoint(marks[1])
    prints = [ConsoleSpec("cloud/n", s) for s in stores]
    assert console_checkpoint(prints[0]) != console_checkpoint(prints[1])
    left, right = SeriesSource("cloud/n", "a"), SeriesSource("cloud/n", "b")
    joins = [StreamJoinSpec(left, right, "NetworkSamples", s, Path("/j")) for s in stores]
    assert join_checkpoint(joins[0]) != join_checkpoint(joins[1])


def former_root(job: str, source: str, target: str, *, hashed: bool) -> Path:
    """Where a default checkpoint was before its name's hash took in the stores (`hashed`:
    a hash of the job and the names alone), or before its name had a hash at all."""

    def safe(text: str, keep: int = 120) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", ".", text.strip("/")).strip(".")[-keep:]

    folder = sluice_home() / "checkpoints" / job
    if not hashed:
        return folder / f"{safe(source)}--{safe(target)}"
    digest = hashlib.sha256(json.dumps([job, source, target]).encode()).hexdigest()[:16]
    return folder / f"{safe(source, 100)}--{safe(target, 100)}-{digest}"


def legacy_root(job: str, source: str, target: str) -> Path:
    return former_root(job, source, target, hashed=False)


@pytest.mark.parametrize("hashed", [True, False], ids=["names-hashed", "unhashed"])
def test_a_default_checkpoint_named_the_former_way_is_found_by_its_own_job_only(hashed):
    to_x = MirrorSpec("edge/n", "cloud/n", "embedded:/e", "embedded:/x")
    to_y = MirrorSpec("edge/n", "cloud/n", "embedded:/e", "embedded:/y")
    old = former_root("mirror", "edge/n", "cloud/n", hashed=hashed)
    with Checkpoint(old, mirror_identity(to_x)):
        pass
    assert mirror_checkpoint(to_x) == old
    # the same names into another store: that checkpoint is not its own
    assert mirror_checkpoint(to_y) not in (old, mirror_checkpoint(to_x))
    # nor one whose names read alike (`cloud.n`), which the unhashed name squashed onto it
    alike = MirrorSpec("edge/n", "cloud.n", "embedded:/e", "embedded:/x")
    assert mirror_checkpoint(alike) != old
    export_old = former_root("export", "edge/n", "/d/out a", hashed=hashed)
    with Checkpoint(export_old, export_identity(export_spec("/d/out a"))):
        pass
    assert export_checkpoint(export_spec("/d/out a")) == export_old
    assert export_checkpoint(export_spec("/d/out.a")) != export_old
    assert export_checkpoint(export_spec("/d/out a", store="embedded:/t")) != export_old


def test_a_names_hashed_checkpoint_that_says_nothing_else_is_kept_rather_than_started_over():
    """One whose `job.json` is missing or unreadable may be this job's: its run reports what
    is wrong with it (or records its identity), where a new checkpoint would start over."""
    spec = MirrorSpec("edge/n", "cloud/n", "embedded:/e", "embedded:/x")
    old = former_root("mirror", "edge/n", "cloud/n", hashed=True)
    old.mkdir(parents=True)
    assert mirror_checkpoint(spec) == old
    (old / "job.json").write_text("{not json")
    assert mirror_checkpoint(spec) == old
    # the unhashed name was shared by other names: only its own identity claims it
    legacy = legacy_root("export", "edge/n", "/d/out a")
    legacy.mkdir(parents=True)
    assert export_checkpoint(export_spec("/d/out a")) != legacy


def test_a_new_default_checkpoint_comes_before_a_former_one():
    to_x = MirrorSpec("edge/n", "cloud/n", "embedded:/e", "embedded:/x")
    new = mirror_checkpoint(to_x)
    with Checkpoint(new, mirror_identity(to_x)):
        pass
    with Checkpoint(legacy_root("mirror", "edge/n", "cloud/n"), mirror_identity(to_x)):
        pass
    assert mirror_checkpoint(to_x) == new


def run_cli(capsys, *argv: str) -> dict:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def nic_events(store, n: int = 6, first: int = 0) -> None:
    if not store.stream_exists("edge/network"):
        store.create_stream("edge/network", segments=2)
    with store.writer("edge/network") as writer:
        for i in range(first, first + n):
            event = {
                "TimestampNanos": [T0 + i * 10**9 + k for k in range(5)],
                "RxBytes": list(range(5)),
                "TxBytes": list(range(5)),
                "RemoteAddr": "ubuntu",
                "Interface": "eth0",
            }
            writer.write(json.dumps(event).encode(), routing_key=f"eth{i % 2}")


@pytest.mark.spark
def test_exports_to_outputs_whose_names_read_alike_keep_their_own_checkpoints(
    spark, store, store_dir, tmp_path, capsys
):
    nic_events(store)
    base = ["--store", f"embedded:{store_dir}", "run", "export", "--stream", "edge/network"]
    base += ["--schema", "NetworkSamples", "--format", "parquet"]
    first = run_cli(capsys, *base, "--output", str(tmp_path / "out a"))
    second = run_cli(capsys, *base, "--output", str(tmp_path / "out.a"))
    assert first["checkpoint"] != second["checkpoint"]
    assert (first["events"], second["events"]) == (6, 6)
    # a checkpoint named the former way goes on where it stopped
    legacy = legacy_root("export", "edge/network", str(tmp_path / "out a"))
    Path(first["checkpoint"]).rename(legacy)
    again = run_cli(capsys, *base, "--output", str(tmp_path / "out a"))
    assert (again["checkpoint"], again["events"]) == (str(legacy), 0)


def run_mirror(capsys, store_dir: Path, to_store: str) -> dict:
    source = ["--store", f"embedded:{store_dir}", "run", "mirror", "--stream", "edge/network"]
    return run_cli(capsys, *source, "--to", "cloud/network", "--to-store", to_store)


def mirrored(store: str) -> int:
    with open_store(store) as opened:
        return opened.info("cloud/network").events


@pytest.mark.spark
def test_a_stream_mirrored_into_two_stores_keeps_a_checkpoint_for_each(
    spark, store, store_dir, tmp_path, capsys
):
    nic_events(store)
    to_x, to_y = f"embedded:{tmp_path / 'x'}", f"embedded:{tmp_path / 'y'}"
    first = run_mirror(capsys, store_dir, to_x)
    second = run_mirror(capsys, store_dir, to_y)
    assert first["checkpoint"] != second["checkpoint"]
    assert (first["events"], second["events"]) == (6, 6)
    nic_events(store, 2, first=6)
    again = run_mirror(capsys, store_dir, to_x)
    assert (again["checkpoint"], again["events"]) == (first["checkpoint"], 2)
    assert (mirrored(to_x), mirrored(to_y)) == (8, 6)


@pytest.mark.spark
@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("hashed", [True, False], ids=["names-hashed", "unhashed"])
def test_a_mirror_goes_on_from_its_checkpoint_named_the_former_way(
    hashed, store, store_dir, tmp_path, capsys
):
    """An upgrade finds the checkpoint its mirror made (copying nothing twice), and a mirror
    of the same streams into another store, which would have shared that name, gets its own."""
    nic_events(store)
    to_x, to_y = f"embedded:{tmp_path / 'x'}", f"embedded:{tmp_path / 'y'}"
    first = run_mirror(capsys, store_dir, to_x)
    old = former_root("mirror", "edge/network", "cloud/network", hashed=hashed)
    Path(first["checkpoint"]).rename(old)  # where that version made it
    nic_events(store, 2, first=6)
    again = run_mirror(capsys, store_dir, to_x)
    assert (again["checkpoint"], again["events"]) == (str(old), 2)
    assert mirrored(to_x) == 8
    other = run_mirror(capsys, store_dir, to_y)
    assert other["checkpoint"] != str(old)
    assert (other["events"], mirrored(to_y)) == (8, 8)
    assert run_mirror(capsys, store_dir, to_x)["checkpoint"] == str(old)


def test_one_store_or_output_spelled_two_ways_has_one_default_checkpoint(tmp_path, monkeypatch):
    # a second spelling once got a new checkpoint: the mirror copied everything again
    (tmp_path / "sub").mkdir()
    (tmp_path / "edge").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "edge")
    edge = f"embedded:{tmp_path / 'edge'}"
    spellings = [edge, f"embedded:{tmp_path / 'sub' / '..' / 'edge'}", f"embedded:{tmp_path}/link"]
    first = MirrorSpec("edge/n", "cloud/n", edge, "embedded:/x")
    with Checkpoint(mirror_checkpoint(first), mirror_identity(first)):
        pass
    for store in spellings:
        spec = MirrorSpec("edge/n", "cloud/n", store, "embedded:/x")
        assert mirror_checkpoint(spec) == mirror_checkpoint(first), store
        with Checkpoint(mirror_checkpoint(first), mirror_identity(spec)):
            pass  # not another job's
    # `embedded:` alone is the default store
    monkeypatch.setenv("SLUICE_STORE", edge)
    alone = MirrorSpec("edge/n", "cloud/n", "embedded:", "embedded:/x")
    assert mirror_checkpoint(alone) == mirror_checkpoint(first)
    # an output spelled with `..`: its name reads otherwise, its checkpoint is the same
    out = export_spec(str(tmp_path / "out"))
    with Checkpoint(export_checkpoint(out), export_identity(out)):
        pass
    assert export_checkpoint(export_spec(str(tmp_path / "sub" / ".." / "out"))) == (
        export_checkpoint(out)
    )
    # another store is still another job
    other = MirrorSpec("edge/n", "cloud/n", f"embedded:{tmp_path / 'sub'}", "embedded:/x")
    assert mirror_checkpoint(other) != mirror_checkpoint(first)


def test_a_mirror_run_with_its_store_spelled_another_way_copies_nothing_twice(
    store, store_dir, tmp_path, capsys
):
    nic_events(store)
    (tmp_path / "sub").mkdir()
    cloud = f"embedded:{tmp_path / 'cloud'}"
    first = run_mirror(capsys, store_dir, cloud)
    again = run_mirror(capsys, tmp_path / "sub" / ".." / store_dir.name, cloud)
    assert again["checkpoint"] == first["checkpoint"]
    assert (first["events"], again["events"], mirrored(cloud)) == (6, 0, 6)
