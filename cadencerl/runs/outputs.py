"""Files a run leaves behind are written whole or not at all: a reader (or a crash) never sees half.

They get the modes any other program's files get (0o666 / 0o777 less the umask): `tempfile` would
make them 0o600 / 0o700, private for no reason, so these helpers create their own temporaries.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path


def _fresh_name(parent: Path, prefix: str, suffix: str = "") -> Path:
    return parent / f"{prefix}{secrets.token_hex(6)}{suffix}"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`; the file keeps
    the mode of the one it replaces, or else gets the umask's. A link is followed (its target is
    replaced, not the link), and what is not a regular file (`/dev/null`, a FIFO) is written to as
    it is: renamed over, it would be replaced by a file."""
    path = Path(path)
    if path.exists() and not path.is_file():      # as given: /dev/stdout resolves to a pipe's fd name
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = _fresh_name(path.parent, f".{path.name}.", ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)   # the kernel applies the umask
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:   # closes `fd` whatever happens next
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f.fileno(), stat.S_IMODE(path.stat().st_mode))
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fresh_dir(parent: Path, prefix: str) -> Path:
    """A new, empty directory in `parent` with the umask's mode (`tempfile.mkdtemp` makes it 0o700)."""
    while True:
        path = _fresh_name(Path(parent), prefix)
        try:
            path.mkdir(0o777)
            return path
        except FileExistsError:
            continue
