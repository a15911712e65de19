"""Prices per device-hour for the planner: the catalog's where it has one, else a user's prices
file; every price carries its source. A bad file is one line naming the field."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from cadencerl.hardware import catalog
from cadencerl.user_files import ConfigError, parse_scenario_file, read_text_file

EXAMPLE = "prices:\n  H800: {per_hour: 2.0, source: \"my cloud's list price, 2026-12\"}"


@dataclass(frozen=True)
class Price:
    per_hour: float       # dollars per device-hour
    source: str


def catalog_prices() -> dict[str, Price]:
    """Every catalog accelerator with a price, with the catalog's source for it."""
    return {name: Price(a.price_per_hour, a.sources.get("price_per_hour", "hardware catalog"))
            for name, a in catalog.ACCELERATORS.items() if a.price_per_hour is not None}


def load_prices(path: Path) -> dict[str, Price]:
    """`prices: {TYPE: {per_hour: X, source: "..."}}` (YAML or TOML); each type a catalog accelerator."""
    data = parse_scenario_file(path, read_text_file(path, "prices"))
    if not isinstance(data, dict) or set(data) != {"prices"} or not isinstance(data["prices"], dict) \
            or not data["prices"]:
        raise ConfigError(f"prices: expected a mapping `prices:` of accelerator types, e.g. {EXAMPLE!r}")
    out = {}
    for name, entry in data["prices"].items():
        where = f"prices.{name}"
        if name not in catalog.ACCELERATORS:
            raise ConfigError(f"{where}: unknown accelerator (known: {', '.join(sorted(catalog.ACCELERATORS))})")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected {{per_hour: NUMBER, source: TEXT}}")
        extra = set(entry) - {"per_hour", "source"}
        if extra:
            raise ConfigError(f"{where}.{sorted(extra)[0]}: unknown key (a price has per_hour and source)")
        value = entry.get("per_hour")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{where}.per_hour: expected a number > 0 (dollars per device-hour), got {value!r}")
        source = entry.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}.source: required: where the price comes from (every price carries its source)")
        out[name] = Price(float(value), source.strip())
    return out


def prices_for(types: list[str], user: dict[str, Price] | None) -> dict[str, Price]:
    """The price of each type: the user's file first, then the catalog; a type with neither is an error."""
    known = {**catalog_prices(), **(user or {})}
    missing = [t for t in types if t not in known]
    if missing:
        raise ConfigError(f"prices: no price for {', '.join(missing)} (the catalog has none); give one in a "
                          f"prices file (--prices FILE), e.g. {EXAMPLE!r}")
    return {t: known[t] for t in types}
