"""The README is a newcomer's page, and every link in the documents resolves inside the
repository (a document's anchors included)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(document: Path) -> set[str]:
    """GitHub's anchors for a document's headings, and its explicit <a id=...>."""
    text = document.read_text()
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def broken_links(document: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for link in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        if not _resolves(target, anchor, root):
            broken.append(link)
    return broken


def _resolves(target: Path, anchor: str, root: Path) -> bool:
    if not target.exists() or root not in (target, *target.parents):
        return False
    return not anchor or target.suffix != ".md" or anchor in anchors(target)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(document):
    assert broken_links(document) == []


def test_the_check_sees_a_broken_link(tmp_path):
    document = tmp_path / "page.md"
    document.write_text("# Page\n[a](#page) [b](missing.md) [c](#nowhere) [d](https://x.org)\n")
    (tmp_path / "inside").mkdir()
    assert broken_links(document, tmp_path) == ["missing.md", "#nowhere"]
    assert broken_links(document, tmp_path / "inside") == ["#page", "missing.md", "#nowhere"]


def test_the_readme_fits_a_few_screens():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES
    assert lines[lines.index("```bash") + 1].startswith("make run")
    assert lines[lines.index("```bash") + 2].startswith("make test")
