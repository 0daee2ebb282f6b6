"""The Dagster instance Sluice runs on: `$SLUICE_HOME/dagster`, with its `dagster.yaml`.

Everything written at run time lives under the home, so Dagster's storage does too. The
instance's configuration is what keeps the streaming jobs from overlapping:

- **pools** (`concurrency.pools`): every step that advances a stream checkpoint (mirror,
  export, bookmark) declares a pool named after its job and family, and each pool has one
  slot, so two runs of one streaming job never run that step at once, whatever launched them
  (a schedule, a sensor, the UI, `make demo`);
- **run queue** (`concurrency.runs`): runs tagged `sluice/exclusive` are queued one at a time
  per tag value, so a second catch-up run waits in the queue instead of taking a run worker.

`python -m assets.instance` writes the file (if it is not there yet) and prints the
directory, for `DAGSTER_HOME=$(python -m assets.instance) dagster dev -w workspace.yaml`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from pipeline import durable
from pipeline.settings import SluiceSettings, load_settings

EXCLUSIVE_TAG = "sluice/exclusive"


def instance_config(max_concurrent_runs: int = 4) -> dict[str, Any]:
    """The `dagster.yaml` of Sluice's instance."""
    return {
        "concurrency": {
            "pools": {"default_limit": 1, "granularity": "op"},
            "runs": {
                "max_concurrent_runs": max_concurrent_runs,
                "tag_concurrency_limits": [
                    {"key": EXCLUSIVE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
                ],
            },
        },
        "telemetry": {"enabled": False},
    }


def prepare_dagster_home(path: Path) -> Path:
    """Create `path` with Sluice's `dagster.yaml` (unless one is there: a user's edits win)
    and its SQLite storage, so a webserver and a daemon started together do not race to
    create the same databases."""
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists():
        durable.write_text(config, yaml.safe_dump(instance_config(), sort_keys=False))
    with dg.DagsterInstance.from_config(str(path)) as instance:
        instance.get_runs(limit=1)
        instance.get_asset_keys(limit=1)
        instance.all_instigator_state()
    return path


def sluice_instance(settings: SluiceSettings) -> dg.DagsterInstance:
    """The persistent instance under `$SLUICE_HOME/dagster` (created on first use)."""
    return dg.DagsterInstance.from_config(str(prepare_dagster_home(settings.dagster_home)))


def main() -> int:
    print(prepare_dagster_home(load_settings().dagster_home))
    return 0


if __name__ == "__main__":
    sys.exit(main())
