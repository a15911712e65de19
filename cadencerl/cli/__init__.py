"""The `cadencerl` command line (see `main.py`)."""

from cadencerl.cli.main import app, main

__all__ = ["app", "main"]
