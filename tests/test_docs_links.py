"""Every link in the user-facing pages (README, BENCHMARKS.md, docs/) and every anchor the code
cites (`PAGE.md#ANCHOR`) points at a file that exists and an anchor the page defines: the pages are
reorganised as measurements change, and a dangling link is a claim the reader cannot check. The code
cites a section by its anchor only, never by number or title, so that the check covers it."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])
CODE_DIRS = ("epp", "tests", "e2e", "scripts", "deploy")
CODE_SUFFIXES = (".py", ".pyi", ".yaml", ".c", ".sh", ".md", ".txt", ".tpl")

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXPLICIT = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
_LINK = re.compile(r"\]\(([^()\s]+)\)")
_CITED = re.compile(r"((?:[\w./-]*/)?[\w.-]+\.md)#([\w-]+)")
# A page named with no anchor after it, and what may follow it on to the next comment line: a
# section named by its title or number ("BENCHMARKS.md 7c", 'docs/x.md, "Title"') instead.
_NAMED = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)(?![\w#-])")
_SECTION_AFTER = re.compile(r"(?:'s)?[\s,(:#*/]*(?:[\"'“]\s*[A-Z]|section\s+\d|\d+[a-z]?\b)")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a `#` there is a shell comment)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(page.read_text(encoding="utf-8")):
        found.update(_EXPLICIT.findall(line))
        match = _HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def _broken_link(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: {dest.relative_to(ROOT)} has no anchor #{anchor}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_on_the_page_resolves(page: Path) -> None:
    broken = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for target in _LINK.findall(line):
            why = _broken_link(page, target)
            if why:
                broken.append(f"line {number}: {why}")
    assert not broken, "\n".join(broken)


def _cited_page(source: Path, name: str) -> Path | None:
    for base in (ROOT, source.parent):
        candidate = (base / name).resolve()
        if candidate.exists():
            return candidate
    matches = [p for p in PAGES if p.name == Path(name).name]
    return matches[0] if len(matches) == 1 else None


@functools.cache
def _code_files() -> tuple[tuple[Path, str], ...]:
    """The code's text files that may cite a page (scripts without a suffix by their `#!`), each
    with its text: read once for both tests below."""
    found = []
    for folder in CODE_DIRS:
        for source in sorted((ROOT / folder).rglob("*")):
            if not source.is_file() or source in PAGES or source == Path(__file__):
                continue  # the pages' own links: the test above
            if source.suffix in CODE_SUFFIXES or (not source.suffix and source.read_bytes()[:2] == b"#!"):
                found.append((source, source.read_text(encoding="utf-8", errors="replace")))
    return tuple(found)


def test_every_anchor_the_code_cites_exists() -> None:
    broken = []
    for source, text in _code_files():
        for number, line in enumerate(text.splitlines(), 1):
            for name, anchor in _CITED.findall(line):
                page = _cited_page(source, name)
                where = f"{source.relative_to(ROOT)}:{number}: {name}#{anchor}"
                if page is None:
                    broken.append(f"{where}: no such page")
                elif anchor not in anchors(page):
                    broken.append(f"{where}: no such anchor")
    assert not broken, "\n".join(broken)


def test_the_code_cites_sections_by_anchor() -> None:
    """BENCHMARKS.md only with an anchor (its method moved to docs/bench/ and moves on), and a
    docs page's section by anchor, not by number or title: those go stale unnoticed."""
    data = ROOT / "tests" / "tokenize" / "data"  # a frozen text corpus
    stale = []
    for source, text in _code_files():
        if data in source.parents:
            continue
        for match in _NAMED.finditer(text):
            page = _cited_page(source, match.group(1))
            if page not in PAGES:
                continue  # not one of the project's pages (a reference note, a GitHub path)
            if page == ROOT / "BENCHMARKS.md" or _SECTION_AFTER.match(text, match.end()):
                number = text.count("\n", 0, match.start()) + 1
                after = text[match.end() : match.end() + 40].split("\n")[0]
                stale.append(f"{source.relative_to(ROOT)}:{number}: {match.group(1)}{after}")
    assert not stale, "cite the section's anchor, PAGE.md#anchor:\n" + "\n".join(stale)


def test_slug_follows_github() -> None:
    assert slug("11c. Long prompts: CPU per request") == "11c-long-prompts-cpu-per-request"
    assert slug("`epp bench fleet`: idle, per request") == "epp-bench-fleet-idle-per-request"
    assert (
        slug("Prefill/decode disaggregation (`epp bench pd`)") == "prefilldecode-disaggregation-epp-bench-pd"
    )
