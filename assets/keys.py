"""Sluice's Dagster names: asset keys, job, op, schedule and sensor names, pools, run tags,
partitions, metadata entries and cursor versions (Dagster's `project_fully_featured`
keeps its names in `constants.py` the same way).

A leaf: it imports only dagster and `pipeline.settings`, so every other module of `assets`
takes its names from here and none imports another for a name. The values are part of the
deployment: the instance's pool and run-queue limits (`assets/instance.py`), run history,
sensor cursors and the tests rely on them, so a change of structure never changes them.
"""

from __future__ import annotations

from typing import Literal

import dagster as dg

from pipeline.settings import StreamFamily

#: The streaming jobs a Dagster step runs until caught up (and that also run as services).
StreamingJob = Literal["mirror", "export", "bookmark"]
#: The file formats of an export (`[exports] formats`; settings refuse any other).
ExportFormat = Literal["parquet", "csv"]

# --- asset keys: `<family>/<asset>`, one family per `[streams.NAME]` ----------------------


def edge_key(family: StreamFamily) -> dg.AssetKey:
    return dg.AssetKey([family.name, "edge_stream"])


def mirror_key(family: StreamFamily) -> dg.AssetKey:
    return dg.AssetKey([family.name, "cloud_mirror"])


def export_key(family: StreamFamily, fmt: ExportFormat) -> dg.AssetKey:
    return dg.AssetKey([family.name, f"{fmt}_export"])


def slices_key(family: StreamFamily) -> dg.AssetKey:
    return dg.AssetKey([family.name, "slices"])


def replay_key(family: StreamFamily, model_name: str) -> dg.AssetKey:
    return dg.AssetKey([family.name, f"replay_{model_name}"])


ANALYTICS_KEY = dg.AssetKey(["analytics", "duckdb_views"])
ANALYTICS_GROUP = "analytics"
#: The analytics views' pool (one slot): DuckDB lets one process at a time write the database.
ANALYTICS_POOL = "sluice_analytics"

# --- jobs, schedules, sensors -------------------------------------------------------------

OBSERVE_EDGE_JOB = "observe_edge_streams"
REFRESH_ANALYTICS_JOB = "refresh_analytics"


def catch_up_job_name(family: StreamFamily) -> str:
    return f"catch_up_{family.name}"


def replay_job_name(family: StreamFamily) -> str:
    return f"replay_{family.name}"


def nightly_schedule_name(family: StreamFamily) -> str:
    return f"nightly_replays_{family.name}"


EDGE_TAIL_SENSOR = "edge_tail_sensor"
NEW_SLICES_SENSOR = "new_slices_sensor"
VIEWS_SENSOR = "analytics_views_sensor"
SERVICE_PROGRESS_SENSOR = "streaming_service_progress"

# --- ops (their names are the step keys of runs) ------------------------------------------


def observe_edge_op(family: StreamFamily) -> str:
    return f"observe_edge_{family.name}"


def catch_up_op(job: StreamingJob, family: StreamFamily) -> str:
    """The step that runs `job` for `family` (the mirror and the slices are named by key)."""
    if job == "export":
        return f"export_{family.name}"
    key = mirror_key(family) if job == "mirror" else slices_key(family)
    return key.to_python_identifier()


def export_checks_op(family: StreamFamily) -> str:
    return f"check_{family.name}_export"


# --- concurrency: pools (one slot each) and the run queue ---------------------------------


def pool(job: StreamingJob, family: StreamFamily) -> str:
    """The concurrency pool of `job` for `family` (one slot: see assets/instance.py)."""
    return f"sluice_{job}_{family.name}"


#: Runs with one value of this tag are queued one at a time (`assets/instance.py`).
EXCLUSIVE_TAG = "sluice/exclusive"


def catch_up_tags(family: StreamFamily) -> dict[str, str]:
    """Run tags that queue the catch-up runs of one family one at a time."""
    return {EXCLUSIVE_TAG: f"catch_up/{family.name}"}


#: Tags Dagster itself writes on materializations and observations.
DATA_VERSION_TAG = "dagster/data_version"
CODE_VERSION_TAG = "dagster/code_version"
#: Tags Dagster itself writes on runs: the partition, the run key, the sensor or schedule.
PARTITION_TAG = "dagster/partition"
RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"
SCHEDULE_NAME_TAG = "dagster/schedule_name"

# --- partitions ---------------------------------------------------------------------------


def slice_partitions(family: StreamFamily) -> dg.DynamicPartitionsDefinition:
    """One partition per slice id of the family (added by the slices sensor)."""
    return dg.DynamicPartitionsDefinition(name=f"{family.name}_slices")


# --- metadata entries that one module writes and another reads ----------------------------

START_CUT = "start_cut"
END_CUT = "end_cut"
LAST_BATCH = "last_batch"
SKIPPED = "skipped"

# --- sensor cursors -----------------------------------------------------------------------

#: The version of every sensor cursor's JSON document.
CURSOR_VERSION: Literal[1] = 1

# --- why the nightly schedule requested a replay run (`assets/schedules.py`) --------------

#: `stale` (a model's version changed, or the slice was never replayed) or `revalidate`.
REPLAY_REASON_TAG = "sluice/replay_reason"
#: On a revalidation: the Dagster run whose replay of the slice is being checked again.
REVALIDATES_TAG = "sluice/revalidates"
