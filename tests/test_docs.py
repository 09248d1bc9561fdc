"""The README and the reference pages in docs/ link each other, and nothing links nowhere.

What each page says is kept true by the tests that read it: docs/papers.md by
test_paper_rows.py (every papers row with its population), docs/extending.md's examples by
test_extending.py (taken from that page and run)."""

from __future__ import annotations

import re

from conftest import REPO

LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _local_links(path):
    return [m.group(1) for m in LINK.finditer(path.read_text(encoding="utf-8")) if "://" not in m.group(1)]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {target for target in _local_links(REPO / "README.md") if target.startswith("docs/")}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages and pages == linked, (pages, linked)


def test_no_local_link_leads_nowhere():
    broken = [(page.name, target) for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
              for target in _local_links(page) if not (page.parent / target).exists()]
    assert not broken, broken
