"""A benchmark's `--child` run in a fresh process on a source tree, for `--compare-tree`: the
tree's own `cadencerl` (by PYTHONPATH, and as working directory), its figures read back as the JSON
of the child's last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_child(script: str, args: list[str], tree: Path | None, **env: str) -> dict:
    """`script --child ARGS` on `tree` (None: this repository), with `env` added to the environment."""
    full = dict(os.environ, **env)
    if tree is not None:
        full["PYTHONPATH"] = str(tree)
    out = subprocess.run([sys.executable, script, "--child", *args], env=full, cwd=tree or REPO, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])
