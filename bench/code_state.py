"""Which code a benchmark measured: the commit, plus any uncommitted runtime changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def code_state() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        dirty = [
            line[3:]
            for line in git("status", "--porcelain", "elasticdl_nb").splitlines()
            if line.strip()
        ]
    except OSError:
        return "?"
    return head + (f" + uncommitted changes in {', '.join(dirty)}" if dirty else "")
