"""Running a command as a user who may not use a file: as root, root's power to read and
write any file is dropped for the command (`setpriv`), so a test sees what a user sees."""

from __future__ import annotations

import os
import shutil

import pytest


def without_dac_override() -> list[str]:
    """A command prefix that runs as this user without root's power over any file's mode."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a file unusable")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"]
