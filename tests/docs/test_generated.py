"""The generated parts of docs/ match what the code and the database say now."""

from __future__ import annotations

import difflib

import pytest

from pipeline import docs


@pytest.mark.parametrize("path", [docs.REFERENCE, docs.ANALYSTS], ids=lambda p: p.name)
def test_generated_file_is_current(path):
    expected = docs.generated()[path]
    committed = path.read_text()
    if committed != expected:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                expected.splitlines(keepends=True),
                "committed",
                "generated now",
                n=1,
            )
        )
        pytest.fail(
            f"{path.relative_to(docs.ROOT)} differs from what the code generates now; "
            f"regenerate it with `{docs.REGENERATE}` and commit it:\n{diff[:4000]}"
        )


def test_every_setting_is_in_the_reference():
    """The walk reaches every key: a table's fields, named entries, optional tables."""
    keys = {s.key for s in docs.toml_settings()}
    assert {
        "streams.NAME.bookmark.min_samples",
        "models.NAME.params",
        "checks.quarantine_rate_max",
        "spark.master",
    } <= keys
    collector = {s.key: s for s in docs.collector_settings()}
    assert {"collector.drain_timeout_seconds", "instance.when_full", "nic.interface"} <= set(
        collector
    )
    assert collector["mqtt.port"].default == "1883"
    assert collector["nic.interface"].default is None  # required
    assert collector["instance.when_full"].kind == "block | shed"


def test_a_new_collector_setting_appears_without_editing_the_generator(monkeypatch):
    """A key the collector's loader starts reading shows up in the reference by itself."""
    from collectors import settings as collector_settings
    from collectors.options import OptionsReader

    original = OptionsReader.finish

    def finish(self, known_hint=""):
        if self.where.endswith("[collector]"):
            self.integer("docs_probe_port", 9464, minimum=0)
        return original(self, known_hint)

    monkeypatch.setattr(OptionsReader, "finish", finish)
    assert collector_settings.OptionsReader is OptionsReader
    rows = {s.key: s for s in docs.collector_settings()}
    assert rows["collector.docs_probe_port"].default == "9464"
    assert rows["collector.docs_probe_port"].kind == "integer"
    assert OptionsReader.finish is finish  # the recording restored what it patched


def test_the_command_line_reference_has_every_command():
    names = {name for name, _ in docs.commands()}
    assert {
        "sluice store verify",
        "sluice run export",
        "sluice replay",
        "sluice analytics refresh",
    } <= names
