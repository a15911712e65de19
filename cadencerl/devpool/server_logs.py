"""What a vLLM server's log says when it failed to start: its cause in one line, and its last lines."""

from __future__ import annotations

from pathlib import Path


def last_error(path: str) -> str:
    """The log's last line naming an error (vLLM's cause, after its traceback), for a one-line message."""
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    named = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (named or lines or ["(empty log)"])[-1][-300:]


def log_tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
