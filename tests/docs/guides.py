"""Run the shell blocks of a guide in `docs/`, in order, as a reader would.

The convention (docs/README.md, "How the guides are tested"):

- a ```console block shows a prompt: each line starting `$ ` is a command (a line ending in
  `\\` continues it), every other line is sample output, not run;
- a ```sh or ```bash block is a script, run as written;
- `<!-- not run: REASON -->` on the line just before the fence leaves that block out (for a
  service that runs until stopped, or a cluster this machine does not have).

All blocks of one guide run in one bash process (`set -eo pipefail`), so a variable or a
`cd` carries over, with `$SLUICE_HOME` a fresh directory and the checkout's `sluice` first on
PATH. A failure names the guide, the line of the command and its output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
_FENCE = re.compile(r"^```(\w+)?\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")
_MARK = "@@sluice-docs-step"


@dataclass(frozen=True, slots=True)
class Step:
    """One command (or one script block) and the line of the guide it starts on."""

    guide: Path
    line: int
    text: str


def steps(guide: Path) -> list[Step]:
    """The commands of `guide` that run, in order."""
    lines = guide.read_text().splitlines()
    found: list[Step] = []
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        language = fence.group(1) or ""
        skipped = index > 0 and _NOT_RUN.match(lines[index - 1])
        end = next(
            (i for i in range(index + 1, len(lines)) if lines[i].startswith("```")), len(lines)
        )
        body = lines[index + 1 : end]
        if language in ("sh", "bash", "console") and not skipped:
            first = index + 2  # 1-based line of the block's first line
            if language == "console":
                found += _prompted(guide, body, first)
            elif any(line.strip() for line in body):
                found.append(Step(guide, first, "\n".join(body)))
        index = end + 1
    return found


def _prompted(guide: Path, body: list[str], first: int) -> list[Step]:
    found: list[Step] = []
    index = 0
    while index < len(body):
        if not body[index].startswith("$ "):
            index += 1
            continue
        start, command = index, [body[index][2:]]
        while command[-1].endswith("\\") and index + 1 < len(body):
            index += 1
            command.append(body[index])
        found.append(Step(guide, first + start, "\n".join(command)))
        index += 1
    return found


def script(guide_steps: list[Step]) -> str:
    """One bash script running every step, each announced by a marker line."""
    parts = ["set -eo pipefail"]
    for number, step in enumerate(guide_steps):
        parts.append(f"echo {_MARK} {number}")
        parts.append(step.text)
    parts.append(f"echo {_MARK} done")
    return "\n".join(parts) + "\n"


def environment(home: Path, bin_dir: Path) -> dict[str, str]:
    """The reader's shell: a fresh home, this checkout's `sluice` first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    sluice = bin_dir / "sluice"
    python = shlex.quote(sys.executable)
    sluice.write_text(f'#!/bin/sh\nexec {python} -m pipeline.cli "$@"\n')
    sluice.chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLUICE_", "PRAVEGA_SENSOR_COLLECTOR_"))
    }
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        SLUICE_HOME=str(home),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        PATH=os.pathsep.join([str(bin_dir), venv_bin, env.get("PATH", "")]),
        PYSPARK_PYTHON=sys.executable,
    )
    return env


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    failed: Step | None
    output: str  # of the failed step, else of the whole run


def run(guide: Path, home: Path, timeout: float) -> Outcome:
    """Run `guide`'s steps from the checkout's root; which step failed, with its output."""
    guide_steps = steps(guide)
    home.mkdir(parents=True, exist_ok=True)  # as `export SLUICE_HOME=$(mktemp -d)` makes it
    env = environment(home, home.parent / f"{home.name}-bin")
    done = subprocess.run(
        ["bash", "-c", script(guide_steps)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    pieces = re.split(rf"^{_MARK} (\S+)\n", done.stdout, flags=re.MULTILINE)
    last = pieces[-2] if len(pieces) > 1 else None
    if done.returncode == 0 and last == "done":
        return Outcome(0, None, done.stdout)
    failed = guide_steps[int(last)] if last not in (None, "done") else None
    return Outcome(done.returncode or 1, failed, pieces[-1])


def describe(outcome: Outcome, guide: Path) -> str:
    """What a reader needs to fix a failed guide."""
    if outcome.failed is None:
        return f"{_shown(guide)}: exited {outcome.returncode}\n{outcome.output}"
    step = outcome.failed
    return (
        f"{_shown(step.guide)}, line {step.line}: exit {outcome.returncode}\n"
        f"$ {step.text}\n--- output ---\n{outcome.output[-6000:]}"
    )


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
