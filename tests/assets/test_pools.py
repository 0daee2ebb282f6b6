"""Two runs of one streaming job, launched at once in two processes with the job's own
executor on Sluice's instance (pools of one slot): their mirror steps never overlap, and
neither has to skip because the other holds the checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import dagster as dg
import pytest

from assets.instance import prepare_dagster_home
from tests.assets.conftest import REPO, samples, write_events
from tests.assets.pools_job import MIRROR

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STEP = "network__cloud_mirror"


def step_window(instance: dg.DagsterInstance, run_id: str) -> tuple[float, float]:
    times = {
        e.dagster_event_type: e.timestamp
        for e in instance.all_logs(run_id)
        if e.is_dagster_event and e.step_key == STEP
    }
    return times[dg.DagsterEventType.STEP_START], times[dg.DagsterEventType.STEP_SUCCESS]


def mirror_outcome(instance: dg.DagsterInstance, run_id: str) -> str:
    """What a run's mirror step recorded: a materialization, or why it had none."""
    mats = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    if [m.event_log_entry.dagster_event.asset_key for m in mats.records] == [MIRROR]:
        return "materialized"
    observed = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION)
    (record,) = observed.records
    why = record.event_log_entry.asset_observation.metadata["skipped"].value
    return "no new events" if why.startswith("no new events since") else why


def test_two_runs_of_the_mirror_never_overlap(settings, tmp_path):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(3))
    home = prepare_dagster_home(tmp_path / "dagster")
    command = [sys.executable, "-m", "tests.assets.pools_job", str(home)]
    procs = [
        subprocess.Popen(command, cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    run_ids = [out.strip().splitlines()[-1] for out in outputs]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        windows = sorted(step_window(instance, run_id) for run_id in run_ids)
        assert windows[0][1] <= windows[1][0], f"mirror steps overlapped: {windows}"
        # Neither found the checkpoint taken: the first mirrored the events, the second
        # found nothing new (an observation saying so, not an empty materialization).
        said = [mirror_outcome(instance, run_id) for run_id in run_ids]
        assert sorted(said) == ["materialized", "no new events"], said
