"""Every relative link of the repository's Markdown documents resolves (file and anchor)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "python" / "README-python.md"]
    + list((ROOT / "docs").glob("*.md"))
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def anchors(path: pathlib.Path) -> set[str]:
    """GitHub-style anchors of a Markdown file's headings."""
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def links(path: pathlib.Path):
    in_code = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            yield n, target


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    assert doc.exists(), doc
    bad = []
    for n, target in links(doc):
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file_part, _, anchor = target.partition("#")
        dest = doc if not file_part else (doc.parent / file_part).resolve()
        if not dest.exists():
            bad.append(f"{doc.name}:{n}: {target} (no such file)")
        elif not str(dest).startswith(str(ROOT)):
            bad.append(f"{doc.name}:{n}: {target} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{doc.name}:{n}: {target} (no heading #{anchor})")
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_broken_link(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("# Title\n[ok](#title) [broken](missing.md) [anchor](#nope)\n", encoding="utf-8")
    targets = [t for _, t in links(doc)]
    assert targets == ["#title", "missing.md", "#nope"]
    assert "title" in anchors(doc) and "nope" not in anchors(doc)
