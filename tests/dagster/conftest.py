"""Fixtures of the Dagster tests: the repository's sluice.toml under the test's own home."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from pipeline.settings import SluiceSettings, load_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(_sluice_home: Path) -> SluiceSettings:
    """The repository's sluice.toml, with every store and output under the test's home."""
    return load_settings(REPO / "sluice.toml", environ={}, home=_sluice_home)


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst
