"""The repository documents itself: every reference in code and docs points at a document in it.

Design notes outside the repository (``ARCHITECTURE.md``, ``API.md``, ``STYLE.md``, a "seed"
document, a shared folder) are not named anywhere; every ``docs/architecture.md §N`` names a
section that exists (and the quoted part after it is in that section), and every
``docs/api.md "Name"`` names one of its headings. Code and docs say what is, not how it came
to be: no issue numbers, no style-rule numbers, no narration of earlier builds. Every relative
link of a Markdown file resolves, to a file and, with ``#anchor``, to one of its headings.
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
# Tracker numbers, rule numbers of a style guide, and prose about earlier builds or sessions.
HISTORY = re.compile(
    r"\bissues? #?\d+|\bSTYLE rule\b|\.\./shared|\bfirst build\b|\bwas \d{3}\b"
    r"|\((?:first|second|third|last|previous) session\)"
    r"|\b(?:in|during) the (?:last|previous) session\b",
    re.IGNORECASE,
)
RECORDED_OUTPUT = "infra/bench/data/"  # what a bench printed, kept as it was printed
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


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


def test_nothing_narrates_the_history_of_the_project() -> None:
    offenders = []
    for path in _tracked_text_files():
        name = str(path.relative_to(ROOT))
        if name.startswith(RECORDED_OUTPUT):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []


def test_the_history_check_catches_what_it_names() -> None:
    caught = [
        "the lead policy of issue 21",
        "see Issue #7",
        "policies are objects (STYLE rule 3)",
        "as ../" + "shared/API.md says",  # split: this file names no outside file either
        "the first build's input path",
        "a livekit block joins the room (was 501)",
        "GPU session, third pass (second session)",
    ]
    passed = ["its last session has ended", "503 when the issuer is down", "was 5 s"]
    assert [bool(HISTORY.search(text)) for text in caught + passed] == [True] * 7 + [False] * 3


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    out: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            anchor, n = _anchor(match.group(1)), 1
            while anchor in out:  # a repeated heading gets -1, -2, ...
                anchor, n = f"{_anchor(match.group(1))}-{n}", n + 1
            out.add(anchor)
    return out


def _links(markdown: str) -> list[str]:
    fenced, out = False, []
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        if not fenced:
            out += LINK.findall(line)
    return out


def test_every_relative_link_in_the_docs_resolves() -> None:
    broken, seen = [], 0
    for path in _tracked_text_files():
        if path.suffix != ".md":
            continue
        for target in _links(path.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            seen += 1
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == [] and seen > 20  # the README and docs do link to each other


def test_anchors_are_the_ones_github_makes() -> None:
    assert _anchor("Command line (`dreamrt`, also `python -m server`)") == (
        "command-line-dreamrt-also-python--m-server"
    )
    assert _anchors("# A\n## A\n```\n# not a heading\n```\n## Several GPUs (`--gpus N`)") == {
        "a",
        "a-1",
        "several-gpus---gpus-n",
    }
