"""Docstrings that cite docs/ARCHITECTURE.md point at sections that exist there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITE = re.compile(r'docs/ARCHITECTURE\.md section (\d+)(?:, "([^"]+)")?')
BARE = re.compile(r"(?<!docs/)ARCHITECTURE\.md")


def cited_sections_missing(doc: str, sources: dict[str, str]) -> list[str]:
    headings = re.findall(r"^#{2,3} (.+)$", doc, re.M)
    numbers = {h.split(".")[0] for h in headings if h[0].isdigit()}
    missing = []
    for name, text in sources.items():
        if BARE.search(text):
            missing.append(f"{name}: cite docs/ARCHITECTURE.md (the file is there)")
        for number, title in CITE.findall(" ".join(text.split())):
            if number not in numbers:
                missing.append(f"{name}: section {number}")
            if title and title not in headings:
                missing.append(f"{name}: section {number}, {title!r}")
    return missing


def test_cited_sections_exist() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    sources = {
        str(p.relative_to(ROOT)): p.read_text()
        for p in sorted([*(ROOT / "kovanex").rglob("*.py"), *(ROOT / "tests").glob("*.py")])
        if p != Path(__file__).resolve()  # this file's own planted citations below
    }
    assert sum(len(CITE.findall(" ".join(t.split()))) for t in sources.values()) >= 5
    assert cited_sections_missing(doc, sources) == []


def test_a_citation_of_a_missing_section_is_reported() -> None:
    doc = "## 1. Layers\n\n## 2. Git\n\n### Claims are compare-and-swap\n"
    src = {
        "a.py": 'see docs/ARCHITECTURE.md section 9 and docs/ARCHITECTURE.md section 2, "Nope"',
        "b.py": 'docs/ARCHITECTURE.md section 2, "Claims are compare-and-swap" is fine',
        "c.py": "(ARCHITECTURE.md section 1)",
    }
    assert cited_sections_missing(doc, src) == [
        "a.py: section 9",
        "a.py: section 2, 'Nope'",
        "c.py: cite docs/ARCHITECTURE.md (the file is there)",
    ]
