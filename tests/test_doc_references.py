"""The repository documents itself: every reference in code and docs points at a document in it.

Design notes outside the repository (``ARCHITECTURE.md``, ``API.md``, ``STYLE.md``, a "seed"
document, a shared folder) are not named anywhere; every ``docs/architecture.md §N`` names a
section that exists (and the quoted part after it is in that section), and every
``docs/api.md "Name"`` names one of its headings.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".js", ".html", ".md", ".toml", ".css", ".txt", ".json", ""}
OUTSIDE = re.compile(r"(?<![\w/])(ARCHITECTURE|API|STYLE)\.md|seed §|\bshared/|design folder")
ARCH_REF = re.compile(r"docs/architecture\.md((?:[ ,;]*§\d+(?:,? \"[^\"]+\")?)+)")
ARCH_PART = re.compile(r"§(\d+)(?:,? \"([^\"]+)\")?")
API_REF = re.compile(r"docs/api\.md \"([^\"]+)\"")
THIS_FILE = Path(__file__).resolve()


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    paths = [ROOT / name for name in listed]
    return [p for p in paths if p.suffix in TEXT_SUFFIXES and p.is_file() and p != THIS_FILE]


def _sections(markdown: str, level: str) -> dict[str, str]:
    """Heading text -> the text under it, for headings of ``level`` (``"## "``)."""
    out: dict[str, str] = {}
    current = None
    for line in markdown.splitlines():
        if line.startswith(level):
            current = line[len(level) :].strip()
            out[current] = ""
        elif current is not None:
            out[current] += line + "\n"
    return out


def test_nothing_refers_to_a_document_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_references_into_docs_name_sections_that_exist() -> None:
    architecture = _sections((ROOT / "docs/architecture.md").read_text(), "## ")
    numbered = {title.split(".")[0]: title + "\n" + body for title, body in architecture.items()}
    api_headings = list(_sections((ROOT / "docs/api.md").read_text(), "## "))
    broken, seen = [], 0
    for path in _tracked_text_files():
        text = re.sub(r"\s*\n\s*(?:#|\*|//)?\s*", " ", path.read_text(errors="replace"))
        for match in ARCH_REF.finditer(text):
            for number, quoted in ARCH_PART.findall(match.group(1)):
                seen += 1
                section = numbered.get(number)
                if section is None or (quoted and quoted.lower() not in section.lower()):
                    broken.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
        for match in API_REF.finditer(text):
            seen += 1
            if not any(match.group(1) in heading for heading in api_headings):
                broken.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert broken == [] and seen > 30  # the code does point into the docs
