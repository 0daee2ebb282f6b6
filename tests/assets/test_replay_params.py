"""A replay asset's parameters from sluice.toml go through the same canonical form as
`sluice replay --model`: equal values are one code version, a value that does not fit the
model is refused when the definitions load."""

from __future__ import annotations

import re

import dagster as dg
import pytest

from assets.replays import replay_asset
from pipeline.jobs.replay import ModelError, load_model
from pipeline.settings import ModelTable

NIC = "pipeline.models.nic:throughput"


def code_version(settings, params: dict) -> str | None:
    asset = replay_asset(
        settings.family("network"), "nic", ModelTable(function=NIC, params=params), settings.home
    )
    return asset.code_versions_by_key[dg.AssetKey(["network", "replay_nic"])]


def test_equal_params_in_sluice_toml_are_one_code_version(settings):
    as_int = code_version(settings, {"burst_mbps": 5, "idle_mbps": 0.01})
    as_float = code_version(settings, {"burst_mbps": 5.0, "idle_mbps": 0.01})
    assert as_int == as_float
    model = load_model(NIC, {"burst_mbps": 5.0, "idle_mbps": 0.01})
    assert as_float == f"{model.version}+params-{model.params_hash[7:23]}"


def test_a_param_that_does_not_fit_the_model_is_refused(settings):
    expected = "parameter burst_mbps='fast' is not a number (its default is 50.0)"
    with pytest.raises(ModelError, match=re.escape(expected)):
        code_version(settings, {"burst_mbps": "fast"})
