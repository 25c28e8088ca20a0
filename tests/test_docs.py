"""The design document is the one the code cites: every `docs/architecture.md, "Section"` citation in the package,
the tests and the benchmarks names a section that exists, and nothing cites a document outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
CITATION = re.compile(r'docs/architecture\.md[,:]?\s*"([^"]+)"')


def _sources() -> list[Path]:
    """The package, the tests and the benchmarks (this file, which spells the patterns out, excepted)."""
    return sorted(p for folder in ("vllm_jax", "tests", "benchmarks") for p in (REPO / folder).rglob("*.py")
                  if p.resolve() != Path(__file__).resolve())


def _flat(text: str) -> str:
    """Comment markers and line breaks removed, so a citation wrapped over two comment lines still reads whole."""
    return re.sub(r"\s+", " ", re.sub(r"\n\s*#", " ", text))


def test_every_cited_section_exists():
    sections = set(re.findall(r"^## (.+)$", DOC.read_text(), re.M))
    cited = {(p.relative_to(REPO), name) for p in _sources() for name in CITATION.findall(_flat(p.read_text()))}
    assert len(cited) >= 10, cited  # the scan sees the citations
    missing = sorted(f"{path}: {name!r}" for path, name in cited if name not in sections)
    assert not missing, f"sections cited but absent from {DOC.name}: {missing}"


def test_nothing_cites_a_design_document_outside_the_repository():
    offenders = [str(p.relative_to(REPO)) for p in [*_sources(), REPO / "README.md"] if "DESIGN.md" in p.read_text()]
    assert not offenders, offenders
