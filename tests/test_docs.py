"""The README stays a front page and the documentation stays one connected set of pages: every relative link
in README.md and docs/ reaches a file (and a heading, for `#anchor` links), and every docs page is reachable
from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks, with inline code spans removed."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(CODE_SPAN.sub("", line))
    return lines


def _slug(title: str) -> str:
    # GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
    title = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), title).lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            slug = _slug(m.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path: Path) -> list[str]:
    return [t for line in _prose(path) for t in LINK.findall(line)
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: ... are not files here


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 250, f"README.md has {len(text.splitlines())} lines; move reference to docs/"
    # The quick start's two commands are what CI (.ci/run) and a new user run; both are Makefile targets.
    targets = set(re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.M))
    for command in ("make demo", "make test"):
        assert command in text, f"README.md no longer names `{command}`"
        assert command.split()[1] in targets


def test_there_are_docs_pages():
    assert DOCS, "docs/ holds no pages"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(README) if t.partition("#")[0]}
    missing = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link to: {missing}"


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Exit codes, and more\n\n[ok](#exit-codes-and-more) "
                                   "[`code`](b.md) [gone](c.md) [bad](#nope)\n```\n[in code](d.md)\n```\n")
    (tmp_path / "b.md").write_text("# B\n")
    page = tmp_path / "a.md"
    assert _links(page) == ["#exit-codes-and-more", "b.md", "c.md", "#nope"]
    assert _anchors(page) == {"title", "exit-codes-and-more"}
