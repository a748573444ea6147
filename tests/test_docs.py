"""The documents the code cites exist: every citation names a file and a section in docs/.

Citation forms (docs/architecture.md §12): ``[orig §4.4]``, ``[design §3]``, ``[arch §1]`` (several
sections: ``[orig §9.3, §13.6]``) and ``docs/<file>.md §N``. In code, a ``§`` that is not part of
such a citation is an error (it points at a document nobody can find). Inside docs/, a bare
``§N`` refers to the same file, and Markdown links to ``file.md#anchor`` must name a heading.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
THIS = Path(__file__).resolve()
SHORT_FORMS = {
    "orig": "original-behaviour.md",
    "design": "design-decisions.md",
    "arch": "architecture.md",
}
_SECTION = r"(\d+(?:\.\d+)*)"
SHORT = re.compile(r"\[(" + "|".join(SHORT_FORMS) + r") ([^\]\n]*)\]")
LONG = re.compile(r"(?:docs/)?([A-Za-z0-9_-]+\.md) §" + _SECTION)
BARE = re.compile("§" + _SECTION)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*$", re.MULTILINE)
NUMBERED = re.compile(_SECTION + r"\.?\s")
LINK = re.compile(r"\]\(([A-Za-z0-9_.-]+\.md)?#([^)\s]+)\)")
# Documents that are not in the repository: the product spec and the reference of the original.
OUTSIDE = re.compile(r"reference\s*\(?§|\bSPEC\b|/work/shared|seed/")


def headings(path: Path) -> list[str]:
    """The heading texts of a Markdown file, in order."""
    return HEADING.findall(path.read_text(encoding="utf-8"))


def sections(path: Path) -> set[str]:
    """The section numbers its headings start with (``4.4`` of ``### 4.4 Subagents …``)."""
    found = set()
    for text in headings(path):
        match = NUMBERED.match(text + " ")
        if match:
            found.add(match.group(1))
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def citations(text: str, own: str | None = None) -> tuple[list[tuple[str, str, int]], list[int]]:
    """Citations in ``text`` as (file, section, line) and the lines of unexplained ``§``.

    ``own`` is the document the text belongs to: its bare ``§N`` cite itself. Without it (code),
    a bare ``§`` is unexplained.
    """
    cited: list[tuple[str, str, int]] = []
    stray: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        rest = line
        for match in SHORT.finditer(line):
            numbers = BARE.findall(match.group(2))
            if not numbers:
                stray.append(number)
            cited += [(SHORT_FORMS[match.group(1)], n, number) for n in numbers]
            rest = rest.replace(match.group(0), " ")
        for match in LONG.finditer(rest):
            cited.append((match.group(1), match.group(2), number))
        rest = LONG.sub(" ", rest)
        for match in BARE.finditer(rest):
            if own is None:
                stray.append(number)
            else:
                cited.append((own, match.group(1), number))
        if own is None and "§" in BARE.sub(" ", rest):
            stray.append(number)
    return cited, stray


def problems(cited: list[tuple[str, str, int]], where: str) -> list[str]:
    """What is wrong with these citations: a missing file or a missing section."""
    found = []
    for name, section, line in cited:
        target = DOCS / name
        if not target.is_file():
            found.append(f"{where}:{line}: cites docs/{name}, which does not exist")
        elif section not in sections(target):
            found.append(f"{where}:{line}: cites docs/{name} §{section}, which has no such heading")
    return found


def code_files() -> list[Path]:
    """Every Python file of the package, the tests and the benchmarks (but this one)."""
    files = [p for part in ("ania_nb", "tests", "bench") for p in (ROOT / part).rglob("*.py")]
    return sorted(p for p in files if p.resolve() != THIS)


def test_every_cited_section_of_the_code_exists():
    errors: list[str] = []
    total = 0
    for path in code_files():
        cited, stray = citations(path.read_text(encoding="utf-8"))
        where = str(path.relative_to(ROOT))
        total += len(cited)
        errors += problems(cited, where)
        errors += [f"{where}:{n}: a § that is no [orig/design/arch §N] citation" for n in stray]
    assert errors == []
    assert total >= 20  # the scanner sees the citations the code has today


def test_nothing_cites_a_document_outside_the_repository():
    offenders = []
    for path in code_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_the_docs_cite_sections_and_headings_that_exist(doc):
    path = DOCS / doc
    text = path.read_text(encoding="utf-8")
    cited, _ = citations(text, own=doc)
    errors = problems(cited, f"docs/{doc}")
    for match in LINK.finditer(text):
        target = DOCS / (match.group(1) or doc)
        line = text[: match.start()].count("\n") + 1
        if not target.is_file():
            errors.append(f"docs/{doc}:{line}: links to {match.group(1)}, which does not exist")
        elif match.group(2) not in {anchor(h) for h in headings(target)}:
            errors.append(f"docs/{doc}:{line}: no heading of {target.name} has #{match.group(2)}")
    assert errors == []


def test_every_doc_numbers_its_sections_once():
    for path in DOCS.glob("*.md"):
        numbers = [NUMBERED.match(h + " ") for h in headings(path)]
        seen = [m.group(1) for m in numbers if m]
        assert len(seen) == len(set(seen)), f"{path.name} numbers a section twice: {seen}"


def test_the_scanner_reports_what_it_should():
    # Guard the guard: missing sections, unknown files and stray § are all caught.
    text = (
        "a [orig §4.4] and [orig §99.1, §4.3] cite; docs/nowhere.md §1 too\n"
        "see the reference (§6.4)\n"
        "[design §]\n"
    )
    cited, stray = citations(text)
    assert ("original-behaviour.md", "4.4", 1) in cited
    assert ("original-behaviour.md", "4.3", 1) in cited
    errors = problems(cited, "x")
    assert any("§99.1" in e for e in errors)
    assert any("nowhere.md" in e for e in errors)
    assert len(errors) == 2
    assert stray == [2, 3]
    assert OUTSIDE.search("cites (reference §4.4)")
    assert anchor("4.3 Running a task") == "43-running-a-task"
