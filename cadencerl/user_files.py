"""A user's file read safely, before any of its fields is checked: an existing regular file of
bounded size holding UTF-8 text, and for a scenario YAML (refusing a key given twice) or TOML by
suffix, syntax errors keeping their line. Every failure is one line naming the field.

Apart from config.py, which validates what is read, so each has one job; ConfigError, the error of
any bad user input, lives here because reading a file is the first place one is raised (config.py
re-exports it for everything above)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

MAX_FILE_BYTES = 1 << 20          # a scenario file is a page of YAML, not a data set


class ConfigError(ValueError):
    """Bad user input; the message is one line that names the field."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (list, dict)):
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                    key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
# YAML 1.2 floats that YAML 1.1 (PyYAML) reads as strings: an exponent without a dot or without a sign
# (`1e-6`, `1e3`, `2.5e6`); only in this loader, after the standard resolvers (an int stays an int).
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_scenario_file(path: Path, text: str) -> object:
    """YAML or TOML by suffix, in any case (`p.TOML`); a syntax error keeps its line number."""
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {path.name} is not valid TOML: {str(exc).splitlines()[0]}") from None
        except RecursionError:
            raise ConfigError(f"config: {path.name} nests too deeply to be a scenario") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config: {path.name} is not valid YAML:{where} {what}") from None
    except RecursionError:
        raise ConfigError(f"config: {path.name} nests too deeply to be a scenario") from None


def read_text_file(path: Path, field: str, limit: int = MAX_FILE_BYTES) -> str:
    """A user file as text: exists, is a file, not huge, UTF-8 (a BOM is fine), CRLF or LF."""
    if path.is_dir():
        raise ConfigError(f"{field}: {str(path)!r} is a directory, not a file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{field}: {str(path)!r} is not a regular file")
    if not path.is_file():
        raise ConfigError(f"{field}: no such file {str(path)!r}")
    try:
        size = path.stat().st_size
        if size > limit:
            raise ConfigError(f"{field}: {path.name} is {size:,} bytes; the limit is {limit:,}")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{field}: {path.name} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                          f"{exc.start})") from None
