"""A job a subprocess can rebuild and run on a given instance (for test_pools.py).

`python -m tests.assets.pools_job DAGSTER_HOME` runs the network family's mirror step with
the job's own executor on that instance and prints the run id.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parents[2]
MIRROR = dg.AssetKey(["network", "cloud_mirror"])


def catch_up_network() -> dg.JobDefinition:
    from assets.definitions import build_definitions
    from pipeline.settings import load_settings

    settings = load_settings(REPO / "sluice.toml", environ={})
    return build_definitions(settings).resolve_job_def("catch_up_network")


def main(dagster_home: str) -> int:
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        job = dg.reconstructable(catch_up_network)
        with dg.execute_job(job, instance, asset_selection=[MIRROR]) as result:
            print(result.run_id, flush=True)
            return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
