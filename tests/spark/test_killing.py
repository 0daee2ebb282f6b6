"""The kill suites' helpers: kill points learned from the lives so far, the slow pass's order."""

from __future__ import annotations

import time
from types import SimpleNamespace

from tests.conftest import REPO, SLOW_COST_SECONDS
from tests.spark.killing import Aim


def life(ran: float, first_batch_after: float | None):
    return SimpleNamespace(started=time.monotonic() - ran, first_batch_after=first_batch_after)


def test_a_life_that_ran_to_its_end_shortens_the_window_after_a_first_batch():
    aim = Aim(startup=10.0, tail=2.5)
    aim.learn(life(ran=11.0, first_batch_after=10.0), killed=False)
    assert 0.3 <= aim.tail < 1.0  # the next kills land before such a life ends
    aim.learn(life(ran=20.0, first_batch_after=10.0), killed=False)
    assert aim.tail < 1.0  # a longer life never widens it past a short one


def test_start_up_is_learned_from_first_batches_and_from_lives_killed_before_one():
    aim = Aim(startup=15.0)
    aim.learn(life(ran=7.0, first_batch_after=5.0), killed=True)
    assert aim.startup == 10.0
    aim.learn(life(ran=25.0, first_batch_after=None), killed=True)  # no first batch in 25 s
    assert aim.startup >= 25.0
    aim.learn(life(ran=200.0, first_batch_after=None), killed=True)
    assert aim.startup == 30.0  # capped: a kill point is never further than this


def test_every_test_in_the_slow_cost_table_exists():
    for prefix in SLOW_COST_SECONDS:
        path, _, name = prefix.partition("::")
        assert (REPO / path).is_file(), prefix
        if name:
            assert f"def {name.split('[')[0]}(" in (REPO / path).read_text(), prefix
