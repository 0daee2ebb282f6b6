"""`python -m pipeline.cli …`: the `sluice` command without its installed script."""

import sys

from pipeline.cli import main

sys.exit(main())
