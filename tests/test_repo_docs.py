"""The repository's documentation stays true to the tree, and the code says what it does.

* Every repository path that a Markdown file cites (inline code, markdown links with their
  #anchors, paths in fenced command blocks) exists.
* Every repository path that code cites in a comment, docstring or message (``docs/x.md``,
  ``tests/test_y.py``, ``engine/runner.py``: a path from the repository's root, or a package
  module's path) exists.
* Nothing cites the design notes that lived outside the repository (the parent folder's
  ``shared`` directory and its upper-case ``*.md`` files): the repository's own are in docs/.
* Code, comments and docstrings carry no issue numbers and no ISO dates: dated measurements and
  history belong in docs/benchmarks/.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Where a package-relative path (``ops/attention.py``, ``reference/mutants.py``) may start.
PACKAGE_ROOTS = ("dflash2rt", "conformance/dflash2rt_conformance", "backends")
FILE_EXTENSIONS = (".py", ".md", ".sh", ".yml", ".yaml", ".toml")
# What a path token may be made of (no spaces, wildcards, placeholders or alternatives).
PATH_TOKEN = re.compile(r"[\w.\-/]+")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")

# Out-of-repository design notes. Spelled so that this file does not match itself.
OUT_OF_REPO = [
    (re.compile(r"\.\./+shared\b"), "the parent folder's shared directory"),
    (re.compile(r"/work/+shared\b"), "an absolute path outside the repository"),
    (re.compile(r"\bshared/+formats\b"), "the out-of-repo formats folder (tests/data/ has them)"),
    (re.compile(r"\b(?:DESIGN|VERIFY|PORTABILITY|STYLE)\.md\b"), "an out-of-repo design file"),
    (re.compile(r"\bDESIGN\s+§"), "a section of the out-of-repo design file"),
    (re.compile(r"\bSTYLE\s+\d"), "an item of the out-of-repo style file"),
]
ISSUE = re.compile(r"\bissues?[ \t]*#?\d+|\bissue-\d+", re.IGNORECASE)
ISO_DATE = re.compile(r"(?<![\d.])(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?!\d)")
CODE_DIRS = ("dflash2rt", "backends", "conformance", "scripts", "tests")
CODE_EXTENSIONS = (".py", ".sh", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".ini")


def repo_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files, relative to the root (POSIX)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = [f for f in out.splitlines() if f and (ROOT / f).is_file()]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    skip = {".git", ".venv", "out", "__pycache__", ".pytest_cache", "build", "dist"}
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


FILES = repo_files()
BASENAMES = {Path(f).name for f in FILES}
TOP_LEVEL = {Path(f).parts[0] for f in FILES} | {"README.md"}
SUB_DIRS = {p.name for base in PACKAGE_ROOTS if (ROOT / base).is_dir()
            for p in (ROOT / base).iterdir() if p.is_dir() and not p.name.startswith("__")}
MARKDOWN = sorted(f for f in FILES if f.endswith(".md"))


def text_of(rel: str) -> str | None:
    path = ROOT / rel
    if path.stat().st_size > 2_000_000:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def is_candidate(token: str, md_dir: Path, fenced: bool) -> bool:
    """Whether a token names a path inside the repository (so it must exist)."""
    if not PATH_TOKEN.fullmatch(token) or token.startswith("/") or "//" in token:
        return False
    first = token.lstrip("./").split("/")[0] if token.startswith("./") else token.split("/")[0]
    if "/" not in token:                        # a bare file name
        return not fenced and token.endswith(FILE_EXTENSIONS) and not token.startswith(".")
    if first in TOP_LEVEL and first not in (".", ".."):
        return token.endswith(FILE_EXTENSIONS) or token.endswith("/") or not fenced
    if fenced:
        return False
    return first in SUB_DIRS or first == ".." or (md_dir / first).exists()


def resolves(token: str, md_dir: Path) -> bool:
    token = token.split("::")[0]
    path = token.rstrip("/")
    if "/" not in token:
        return token in BASENAMES
    bases = [md_dir, ROOT] + [ROOT / b for b in PACKAGE_ROOTS]
    for base in bases:
        p = (base / path)
        if p.exists() and (not token.endswith("/") or p.is_dir()):
            try:
                p.resolve().relative_to(ROOT)
            except ValueError:
                continue
            return True
    return False


def cited_paths(rel: str) -> list[tuple[int, str, str]]:
    """(line, token, kind) of every repository path the Markdown file cites."""
    md_dir = (ROOT / rel).parent
    out: list[tuple[int, str, str]] = []
    in_fence = False
    for i, line in enumerate((ROOT / rel).read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            for raw in line.split():
                token = raw.strip("()[],;:'\"").split("#")[0]
                if token and is_candidate(token, md_dir, fenced=True):
                    out.append((i, token, "command"))
            continue
        for m in LINK.finditer(line):
            out.append((i, m.group(1), "link"))
        for m in INLINE_CODE.finditer(line):
            for raw in m.group(1).split():
                token = raw.strip("()[],;'\"").split("#")[0]
                if token and is_candidate(token, md_dir, fenced=False):
                    out.append((i, token, "code"))
    return out


def link_problem(target: str, rel: str) -> str | None:
    if re.match(r"[a-z][a-z0-9+.-]*:", target):       # http:, https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    md = ROOT / rel
    dest = (md.parent / path) if path else md
    if not dest.exists():
        return "no such file or folder"
    try:
        dest.resolve().relative_to(ROOT)
    except ValueError:
        return "outside the repository"
    if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading with anchor #{anchor} in {dest.relative_to(ROOT).as_posix()}"
    return None


@pytest.mark.parametrize("rel", MARKDOWN)
def test_paths_cited_in_markdown_exist(rel):
    problems = []
    md_dir = (ROOT / rel).parent
    for line, token, kind in cited_paths(rel):
        if kind == "link":
            why = link_problem(token, rel)
            if why:
                problems.append(f"{rel}:{line}: link ({token}): {why}")
        elif not resolves(token, md_dir):
            problems.append(f"{rel}:{line}: `{token}` ({kind}) does not exist in the repository")
    assert not problems, "\n".join(problems)


# In code: a path from the root (its first folder one of the repository's) or from a package
# root (its first folder one of a package's sub-packages), ending in a file name or a slash.
CODE_CITATION = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+(?:[\w-]+\.(?:py|md|sh|json|toml)\b"
                           r"|(?=[\s`'\"),;:]|$)))")
ROOT_FOLDERS = ("docs", "tests", "scripts", "dflash2rt", "conformance", "backends", ".ci")


def code_citations(rel: str) -> list[tuple[int, str]]:
    """(line, path) of every repository path a code file names (see CODE_CITATION)."""
    text = text_of(rel)
    out: list[tuple[int, str]] = []
    for i, line in enumerate((text or "").splitlines(), 1):
        for m in CODE_CITATION.finditer(line):
            token = m.group(1)
            first = token.split("/")[0]
            if first in ROOT_FOLDERS or (first in SUB_DIRS and token.endswith(".py")):
                out.append((i, token))
    return out


CODE_FILES = sorted(f for f in FILES if f.endswith((".py", ".sh")) and f.split("/")[0] in
                    ("dflash2rt", "backends", "conformance", "scripts", "tests", ".ci"))


# Tests build trees of their own (plugin folders, test files) under tmp_path: there, paths
# under backends/ and tests/ name those, not the repository's.
BUILT_BY_TESTS = ("backends/", "tests/")


def test_paths_cited_in_code_exist():
    problems = [f"{rel}:{line}: {token} does not exist in the repository"
                for rel in CODE_FILES if rel != "tests/test_repo_docs.py"
                for line, token in code_citations(rel)
                if not (rel.startswith("tests/") and token.startswith(BUILT_BY_TESTS))
                and not resolves(token, (ROOT / rel).parent)]
    assert not problems, "\n".join(problems)


def test_code_citations_are_found():
    """The check above sees the citations code makes (a pattern that found none would pass)."""
    found = {t for rel in CODE_FILES for _, t in code_citations(rel)}
    assert {"docs/adaptive.md", "docs/watermark.md"} & found and len(found) > 40


def test_readme_and_docs_are_checked():
    """The check above covers the README and every page of docs/ (a glob that found nothing
    would pass vacuously)."""
    assert "README.md" in MARKDOWN
    docs = [f for f in MARKDOWN if f.startswith("docs/")]
    assert {"docs/design.md", "docs/verification.md", "docs/benchmarks/README.md"} <= set(docs)
    assert sum(len(cited_paths(f)) for f in ["README.md", *docs]) > 50


def test_readme_indexes_every_page_of_docs():
    """The README's index of docs/ links every page at its top level (and benchmarks/ by its
    README): a new page is findable from the front door."""
    readme = (ROOT / "README.md").read_text()
    linked = {m.split("#")[0] for m in LINK.findall(readme)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"docs/benchmarks/README.md"}
    assert len(pages) > 5
    assert not pages - linked, f"README does not link {sorted(pages - linked)}"


def test_nothing_cites_design_notes_outside_the_repository():
    problems = []
    for rel in FILES:
        text = text_of(rel)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for pattern, what in OUT_OF_REPO:
                if pattern.search(line):
                    problems.append(f"{rel}:{i}: {what}: {line.strip()[:120]}")
    assert not problems, ("cite docs/ (design.md, verification.md, portability.md, ...) or "
                          "tests/data/ instead:\n" + "\n".join(problems))


def test_code_has_no_issue_numbers_or_dates():
    problems = []
    for rel in FILES:
        if not rel.startswith(tuple(d + "/" for d in CODE_DIRS)) or rel.startswith("tests/data/"):
            continue
        if not rel.endswith(CODE_EXTENSIONS):
            continue
        text = text_of(rel)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for pattern, what in ((ISSUE, "an issue number"), (ISO_DATE, "a date")):
                m = pattern.search(line)
                if m:
                    problems.append(f"{rel}:{i}: {what} ({m.group(0)!r}): {line.strip()[:120]}")
    assert not problems, ("say what the code does; dated figures and history go to "
                          "docs/benchmarks/:\n" + "\n".join(problems))


_N, _DAY = "18", "-".join(("2026", "12", "02"))    # assembled, so this file stays clean


@pytest.mark.parametrize("line, found", [
    (f"# fixed in issue {_N}", True), (f"(Issues {_N} and 15)", True), (f"see issue #{_N}", True),
    (f"the issue-{_N} mutants", True), (f"measured {_DAY} 09:00 UTC", True),
    ("intel-sycl-rt==2025.0.4", False), ("known_issues.py", False), ("Qwen3-0.6B", False),
    ("llama3.1-8b, torch 2.13", False), ("an issue with 3 rows", False), ("v2026.12.02", False),
])
def test_the_code_patterns_are_precise(line, found):
    assert bool(ISSUE.search(line) or ISO_DATE.search(line)) is found
