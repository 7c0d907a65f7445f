"""Every citation of a docs page's section names a heading that page has.

Code, tests and docs cite sections as ``docs/design.md, "Live migration"``
(also with the path in backticks, or the title in parentheses) and link them
as ``docs/design.md#live-migration``. When a page is split or a heading
renamed, a citation left behind points at nothing; this finds it. A cited
title matches a heading equal to it, or one that starts with it and goes on
after a colon (``"Option names"`` for ``Option names: why ...``); a
heading's numbering (``4. One pass over a VM``) and backticks do not count.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
#: What is scanned for citations: the product, the tests, the benchmarks, the docs.
SCANNED = ("pvestord", "qmeventd_py", "ha_placement", "tests", "bench", "docs", "packaging",
           "scripts", "systemd")
SUFFIXES = (".py", ".md", ".pm", ".sh")

PAGE = r"(?:docs/)?(?P<page>[a-z][a-z0-9_-]*)\.md"
#: ``docs/X.md, "Title"``, ``docs/X.md`` ("Title"), (`docs/X.md`, "Title"), and
#: ``docs/X.md, 'Title'`` inside a Python string.
QUOTED = re.compile(r"`{0,2}" + PAGE + r"`{0,2}(?:,\s*|\s*\(\s*)"
                    r"(?:\"(?P<title>[^\"]+)\"|'(?P<single>[^'\n]+)')")
#: ``docs/X.md#anchor`` and Markdown links ``(X.md#anchor)``.
ANCHOR = re.compile(PAGE + r"#(?P<anchor>[a-z0-9_-]+)")
#: A line break inside a comment or docstring, with what starts the next line.
BREAK = re.compile(r"\s*\n\s*(?:#:?\s*)?")
#: Python's implicit concatenation of string literals across a line break.
JOINED = re.compile(r"[\"']\s*\n\s*[rf]{0,2}[\"']")


def headings(page: Path) -> list[str]:
    titles = []
    fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6}\s+(.*?)\s*$", line)):
            titles.append(m.group(1))
    return titles


def plain(title: str) -> str:
    return re.sub(r"^\d+\.\s+", "", title.replace("`", "")).strip()


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    lowered = title.strip().lower()
    return re.sub(r"[^\w\- ]", "", lowered).replace(" ", "-")


def names(title: str, titles: list[str]) -> bool:
    wanted = plain(" ".join(title.split()))
    return any(plain(t) == wanted or plain(t).startswith(wanted + ":") for t in titles)


def sources() -> list[Path]:
    found = [REPO / "README.md", REPO / "Makefile"]
    for top in SCANNED:
        found += [p for p in sorted((REPO / top).rglob("*"))
                  if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return found


def citations() -> list[tuple[str, str, str, str]]:
    """(where, page, kind, what) for every citation of a page under docs/."""
    pages = {p.stem for p in DOCS.glob("*.md")}
    cited = []
    for path in sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".py":
            text = JOINED.sub("", text)
        text = BREAK.sub(" ", text)
        where = str(path.relative_to(REPO))
        for m in QUOTED.finditer(text):
            if m.group("page") in pages:
                title = m.group("title") or m.group("single")
                cited.append((where, m.group("page"), "title", title))
        for m in ANCHOR.finditer(text):
            if m.group("page") in pages:
                cited.append((where, m.group("page"), "anchor", m.group("anchor")))
    return cited


def test_the_scan_finds_the_citations_it_is_for() -> None:
    found = citations()
    assert ("pvestord/engine/migration.py", "design", "title", "Live migration") in found
    assert ("README.md", "design", "anchor", "failure-handling") in found
    assert len(found) > 20


@pytest.mark.parametrize("where, page, kind, what", citations())
def test_a_cited_section_exists(where: str, page: str, kind: str, what: str) -> None:
    titles = headings(DOCS / f"{page}.md")
    if kind == "anchor":
        assert what in {slug(t) for t in titles}, (
            f"{where} links docs/{page}.md#{what}, which no heading of that page makes")
    else:
        assert names(what, titles), (
            f"{where} cites docs/{page}.md, \"{what}\", which is no heading of that page")
