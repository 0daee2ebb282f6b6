"""Named crash points: a spec is read strictly, survives pickling (a foreachBatch function
travels to a Spark Connect server), and a hit is a real SIGKILL at the configured pass."""

from __future__ import annotations

import pickle
import re
import signal
import subprocess
import sys

import pytest

from pipeline.failpoints import BadFailpoints, Failpoints


def test_a_spec_counts_hits_per_point():
    points = Failpoints(" a:3 , b ", known=("a", "b", "c"))
    assert points.armed and points.remaining == {"a": 3, "b": 1}
    points.hit("a")
    points.hit("c")  # not armed: nothing happens
    assert points.remaining == {"a": 2, "b": 1}
    assert not Failpoints(None).armed and not Failpoints("").armed


@pytest.mark.parametrize(
    ("spec", "reason"),
    [("a:0", "needs a hit count of 1 or more"), ("a:-1", "needs a hit count of 1 or more"),
     ("a:²", "needs a hit count of 1 or more"), ("z", "names no point of a, b")],
)  # fmt: skip
def test_a_bad_spec_is_refused_naming_the_variable_and_the_item(spec, reason):
    said = f"SLUICE_X: failpoint {spec!r} {reason}; use NAME or NAME:HIT, separated by commas"
    with pytest.raises(BadFailpoints, match=re.escape(said)):
        Failpoints(spec, variable="SLUICE_X", known=("a", "b"))


def test_failpoints_survive_pickling_with_their_counts():
    points = Failpoints("a:2", group=True)
    points.hit("a")
    copy = pickle.loads(pickle.dumps(points))
    assert copy.remaining == {"a": 1}
    copy.hit("b")


def test_the_configured_hit_kills_the_process_with_sigkill():
    script = (
        "from pipeline.failpoints import Failpoints\n"
        "points = Failpoints('step:2')\n"
        "for i in range(3):\n"
        "    print(i, flush=True)\n"
        "    points.hit('step')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1"]
    assert done.stderr == "failpoint step: SIGKILL\n"
