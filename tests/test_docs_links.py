"""Every relative link (and #anchor) in README.md, docs/ and benchmarks/ resolves: the README is a
guide into docs/, and a page moved or a heading renamed must not leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", path.read_text()).splitlines():
        if m := re.match(r"#{1,6} (.*)", line):
            s = _slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]


def broken_links(found: list[Path], root: Path = ROOT) -> list[str]:
    bad = []
    for page in found:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue                       # http:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = page.relative_to(root)
            if not dest.exists():
                bad.append(f"{where}: no file {target}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{where}: no heading #{anchor} in {target}")
    return bad


def test_every_relative_link_resolves() -> None:
    assert len(pages()) > 5
    assert broken_links(pages()) == []


def test_a_dead_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Title here\n[ok](#title-here) [gone](#nope) [file](missing.md) [web](https://x.y)\n")
    assert broken_links([page], tmp_path) == ["p.md: no heading #nope in #nope", "p.md: no file missing.md"]
