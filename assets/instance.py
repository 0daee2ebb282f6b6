"""The Dagster instance Sluice runs on: `$SLUICE_HOME/dagster`, with its `dagster.yaml`.

Its configuration keeps the streaming jobs from overlapping: every catch-up step declares a
pool of one slot (`assets/keys.py: pool`), and runs tagged `sluice/exclusive` are queued one
at a time per tag value (`assets/DESIGN.md` says why both).

`python -m assets.instance` writes the file (if it is not there yet) and prints the
directory, for `DAGSTER_HOME=$(python -m assets.instance) dagster dev -w workspace.yaml`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from assets.keys import EXCLUSIVE_TAG
from pipeline import durable
from pipeline.settings import SluiceSettings, load_settings


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
