"""One collector process for the kill-and-recover suites.

    python collector_worker.py CONFIG_TOML

Runs `run_service` on the configuration (instances from the file only), with the failpoints
of `$SLUICE_COLLECTOR_FAILPOINTS`, until SIGTERM or until every driver has finished. It
imports no more than the collector itself, so a restart costs a fraction of a second.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from collectors.failpoints import collector_failpoints
from collectors.service import run_service
from collectors.settings import load_settings


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    path = Path(sys.argv[1])
    settings = load_settings(path, {}, "embedded:/unused", path.parent / "home")
    return run_service(settings, collector_failpoints())


if __name__ == "__main__":
    sys.exit(main())
