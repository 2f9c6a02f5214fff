"""Every relative link in README.md and docs/ points at a file that exists, and every
`#anchor` at a heading of its target, slugged as GitHub slugs headings."""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# [text](target) and ![alt](target); the target ends at the first space or ")".
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(_INLINE_CODE.sub("", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (letters,
    digits, `-`, `_` and spaces kept), spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N"))
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 … for repeats."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = _HEADING.match(line) if not fenced else None
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file or anchor does not exist, as a message."""
    problems = []
    for line in prose_lines(path.read_text()):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, …
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                problems.append(f"{where}: no file {os.path.relpath(resolved, ROOT)}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: no heading #{anchor}")
    return problems


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_slug_is_githubs():
    assert slug("2.0 Vision-language families: counting rule and spans") == (
        "20-vision-language-families-counting-rule-and-spans"
    )
    assert slug("The door: what a client can cost") == "the-door-what-a-client-can-cost"
    assert slug("Plain `code` and [a link](x.md)") == "plain-code-and-a-link"


def test_a_broken_link_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Real heading\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#real-heading) [gone](c.md) [no anchor](b.md#missing)\n"
        "```\n[in code](nowhere.md)\n```\n`[inline](nowhere.md)` [web](https://x.org/y)\n"
    )
    assert broken_links(page) == [
        "a.md: c.md: no file c.md",
        "a.md: b.md#missing: no heading #missing",
    ]
