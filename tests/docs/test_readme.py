"""The README's Python example of the stream store runs as shown, on a new store.

The guides' shell blocks are run by `test_guides.py`; the README's Python block is not a
shell block, so it is run here: the one place a reader copies it from must work on its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_SHOWN_STORE = "embedded:/var/lib/sluice/streams"


def _store_example() -> str:
    """The README's Python block that opens a store."""
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.MULTILINE | re.DOTALL)
    found = [b for b in blocks if "open_store(" in b]
    assert len(found) == 1, "README.md: expected one Python example of open_store"
    return found[0]


def test_the_store_example_runs_on_a_new_store(tmp_path):
    example = _store_example()
    assert _SHOWN_STORE in example
    code = example.replace(_SHOWN_STORE, f"embedded:{tmp_path / 'streams'}")
    check = "\nassert [e.payload for e in events] == [b'{\"TimestampNanos\": [1]}'], events\n"
    done = subprocess.run(
        [sys.executable, "-c", code + check],
        cwd=README.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
