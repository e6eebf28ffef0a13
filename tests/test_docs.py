"""The repository stands on its own and its documentation links hold: no tracked file points at
documents outside the repository, every link into docs/math.md (a `#anchor` or a `§Section`
name) names a heading that exists, and every relative link in README.md and docs/*.md reaches
a file. Reads only tracked files (git ls-files); well under a second."""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MATH = "docs/math.md"

# Written in two pieces so that this file does not match itself.
OUTSIDE_REFERENCES = ("SPEC" + ".md", "../" + "shared")

_LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_MATH_ANCHOR = re.compile(r"docs/math\.md#([^\s)\]`'\">,;]+)")
_MATH_SECTION = re.compile(r"docs/math\.md §([^\n]*)")


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def text_of(path: str) -> str | None:
    data = (ROOT / path).read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def markdown_docs() -> list[str]:
    return ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup reduced to its text, lower case, every
    character that is not a letter, digit, space, hyphen or underscore dropped, spaces to
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    kept = [c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN"]
    return "".join(kept).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The ATX headings of a markdown file, outside fenced code blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                out.append(m.group(1))
    return out


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of `path` (a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    result = set()
    for h in headings(path):
        slug = github_slug(h)
        k = seen.get(slug, 0)
        result.add(slug if k == 0 else f"{slug}-{k}")
        seen[slug] = k + 1
    return result


def links(path: str) -> list[tuple[int, str]]:
    """(line, target) of every markdown link and image outside fenced code blocks and outside
    inline code."""
    out, fenced = [], False
    for no, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        out += [(no, m.group(1)) for m in _LINK.finditer(line)]
        out += [(no, m.group(1)) for m in _IMAGE.finditer(line)]
    return out


def test_github_slug_rules():
    assert github_slug("Token log-prob and entropy") == "token-log-prob-and-entropy"
    assert github_slug("Z-head") == "z-head"
    assert github_slug("GRPO and DAPO policy loss") == "grpo-and-dapo-policy-loss"
    assert github_slug("`linear_token_logprob`: the fused path") == "linear_token_logprob-the-fused-path"
    assert github_slug("A [link](x.md) here") == "a-link-here"
    assert github_slug("Ünïcode §5, too!") == "ünïcode-5-too"


def test_no_reference_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if path.startswith(".ci/"):
            continue
        text = text_of(path)
        if text is None:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            if any(ref in line for ref in OUTSIDE_REFERENCES):
                offenders.append(f"{path}:{no}: {line.strip()[:100]}")
    assert not offenders, "references to documents outside the repository:\n" + "\n".join(offenders)


def test_math_doc_links_name_existing_sections():
    math = ROOT / MATH
    assert math.is_file(), f"{MATH} is missing"
    known = anchors(math)
    titles = headings(math)
    assert len(known) >= 10, f"{MATH} has too few sections: {sorted(known)}"
    bad = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            for m in _MATH_ANCHOR.finditer(line):
                if m.group(1) not in known:
                    bad.append(f"{path}:{no}: #{m.group(1)}")
            for m in _MATH_SECTION.finditer(line):
                # "docs/math.md §Group advantage)." : the name must be a heading, whole.
                rest = m.group(1)
                if not any(rest.startswith(t) and not rest[len(t):len(t) + 1].isalnum() for t in titles):
                    bad.append(f"{path}:{no}: §{rest[:40]}")
    assert not bad, f"links into {MATH} naming no heading (headings: {titles}):\n" + "\n".join(bad)


def test_relative_links_in_docs_resolve():
    bad = []
    for doc in markdown_docs():
        base = (ROOT / doc).parent
        for no, target in links(doc):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            file_part, _, fragment = target.partition("#")
            dest = (base / file_part).resolve() if file_part else (ROOT / doc).resolve()
            if not dest.exists():
                bad.append(f"{doc}:{no}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                bad.append(f"{doc}:{no}: {target} (no heading #{fragment})")
    assert not bad, "broken relative links:\n" + "\n".join(bad)


def test_link_checks_catch_breakage(tmp_path):
    """The checks above can fail: a missing file and a missing anchor are reported."""
    doc = tmp_path / "d.md"
    doc.write_text("# Some title\n\n## Some title\n\n```\n# not a heading\n```\n")
    assert anchors(doc) == {"some-title", "some-title-1"}
    assert "not-a-heading" not in anchors(doc)
    assert not (ROOT / "docs" / "no-such-file.md").exists()
    assert "no-such-section" not in anchors(ROOT / MATH)
