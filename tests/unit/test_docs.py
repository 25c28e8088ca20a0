"""The design the code cites is the docs site's: every `docs/<page>.md, "Section"` citation in the package, the
tests, the benchmarks, CI, the README and the docs names a page that exists and a `## ` section on that page;
nothing cites the single design document the pages replaced or a document outside the repository; the README's
links resolve and its test command is the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# a page of docs/ and a section name; the quotes may be escaped (a citation inside a string literal)
CITATION = re.compile(r'(docs/[\w./-]+\.md)(?:[,:]\s*|\s+)\\?"([^"\\]+)\\?"')
OLD_DOCUMENT = "docs/" + "architecture.md"  # split into docs/architecture/*.md; spelled so this file does not cite it
TEST_COMMAND = "python -m pytest -q -n 2 --dist loadfile"


def _sources() -> list[Path]:
    """The package, the tests, the benchmarks, CI, the README and the docs (this file excepted)."""
    code = [p for folder in ("vllm_jax", "tests", "benchmarks") for p in (REPO / folder).rglob("*.py")]
    return sorted(p for p in [*code, *(REPO / ".ci").glob("*"), REPO / "README.md", *(REPO / "docs").rglob("*.md")]
                  if p.is_file() and p.resolve() != Path(__file__).resolve())


def _flat(text: str) -> str:
    """Comment markers and line breaks removed, so a citation wrapped over two comment lines still reads whole."""
    return re.sub(r"\s+", " ", re.sub(r"\n\s*#", " ", text))


def _sections(page: Path) -> set[str]:
    return set(re.findall(r"^## (.+?)\s*$", page.read_text(), re.M))


def _slug(title: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())


def test_every_cited_page_and_section_exists():
    cited = {(p.relative_to(REPO), page, name) for p in _sources()
             for page, name in CITATION.findall(_flat(p.read_text()))}
    assert len({c for c in cited if c[1].startswith("docs/architecture/")}) >= 50, cited  # the scan sees them
    missing = sorted(f"{src}: {page}, {name!r}" for src, page, name in cited
                     if not (REPO / page).is_file() or name not in _sections(REPO / page))
    assert not missing, f"cited pages or sections that do not exist: {missing}"


def test_nothing_cites_the_replaced_design_document():
    assert not (REPO / OLD_DOCUMENT).exists()
    offenders = [str(p.relative_to(REPO)) for p in _sources() if OLD_DOCUMENT in p.read_text()]
    assert not offenders, f"cite docs/architecture/<page>.md, \"Section\" instead: {offenders}"


def test_nothing_cites_a_design_document_outside_the_repository():
    offenders = [str(p.relative_to(REPO)) for p in _sources() if "DESIGN.md" in p.read_text()]
    assert not offenders, offenders


def test_readme_links_resolve():
    """The README is not part of the site (mkdocs build --strict checks the site's links): its relative links
    must name files of the repository, and their anchors headings of those files."""
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(links) >= 10, links
    broken = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path if path else REPO / "README.md"
        if not target.exists():
            broken.append(link)
        elif anchor and anchor not in {_slug(h) for h in re.findall(r"^#+ (.+?)\s*$", target.read_text(), re.M)}:
            broken.append(link)
    assert not broken, broken


def test_readme_test_command_is_the_one_ci_runs():
    quick_start = (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert TEST_COMMAND in quick_start
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text()
