"""CITATION.cff: Citation File Format 1.2.0, the project as pyproject.toml describes it, and the four papers
exactly as their method pages cite them.

The key sets below are the CFF 1.2.0 schema's (its ``properties`` for the file, a reference and a
person), so a misspelt key fails here as ``cffconvert --validate`` would fail on it.
"""

from __future__ import annotations

import re

import pytest
import tomllib
import yaml

from tests.paths import ROOT

CFF_KEYS = {
    "abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi", "identifiers", "keywords",
    "license", "license-url", "message", "preferred-citation", "references", "repository", "repository-artifact",
    "repository-code", "title", "type", "url", "version",
}  # fmt: skip
CFF_REQUIRED = {"authors", "cff-version", "message", "title"}
REFERENCE_KEYS = {
    "abbreviation", "abstract", "authors", "collection-doi", "collection-title", "collection-type", "commit",
    "conference", "contact", "copyright", "data-type", "database", "database-provider", "date-accessed",
    "date-downloaded", "date-published", "date-released", "department", "doi", "edition", "editors", "editors-series",
    "end", "entry", "filename", "format", "identifiers", "institution", "isbn", "issn", "issue", "issue-date",
    "issue-title", "journal", "keywords", "languages", "license", "license-url", "loc-end", "loc-start", "location",
    "medium", "month", "nihmsid", "notes", "number", "number-volumes", "pages", "patent-states", "pmcid", "publisher",
    "recipients", "repository", "repository-artifact", "repository-code", "scope", "section", "senders", "start",
    "status", "term", "thesis-type", "title", "translators", "type", "url", "version", "volume", "volume-title", "year",
    "year-original",
}  # fmt: skip
REFERENCE_REQUIRED = {"authors", "title", "type"}
PERSON_KEYS = {
    "address", "affiliation", "alias", "city", "country", "email", "family-names", "fax", "given-names",
    "name-particle", "name-suffix", "orcid", "post-code", "region", "tel", "website",
}  # fmt: skip
ENTITY_KEYS = {"name", "address", "city", "country", "email", "website", "alias", "orcid", "tel", "fax", "region"}
# The method page of each cited paper, in the order CITATION.cff lists them.
PAPER_PAGES = ("sdfed", "pfedlora", "fedd2p", "pep-fedpt")


@pytest.fixture(scope="module")
def citation() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))


def words(text: str) -> str:
    """``text`` with Markdown emphasis dropped and every run of white space one space."""
    return " ".join(text.replace("*", "").split())


def check_authors(authors: list) -> None:
    assert authors, "a CFF work needs at least one author"
    for author in authors:
        assert set(author) <= PERSON_KEYS or set(author) <= ENTITY_KEYS, author
        assert author.get("family-names") or author.get("name"), author


def test_the_file_is_cff_1_2_0_with_its_required_keys(citation):
    assert citation["cff-version"] == "1.2.0"
    assert CFF_REQUIRED <= set(citation) <= CFF_KEYS, set(citation) - CFF_KEYS
    check_authors(citation["authors"])
    for reference in citation["references"]:
        assert REFERENCE_REQUIRED <= set(reference) <= REFERENCE_KEYS, set(reference) - REFERENCE_KEYS
        check_authors(reference["authors"])
        assert isinstance(reference["year"], int)


def test_the_project_is_cited_as_pyproject_describes_it(citation):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (citation["title"], citation["type"]) == (project["name"], "software")
    assert (citation["version"], citation["license"]) == (project["version"], project["license"])


def test_the_four_papers_are_cited_as_their_method_pages_cite_them(citation):
    references = citation["references"]
    assert len(references) == len(PAPER_PAGES)
    for reference, page in zip(references, PAPER_PAGES, strict=True):
        text = words((ROOT / "docs" / "methods" / f"{page}.md").read_text(encoding="utf-8"))
        cite_as = text.split("Cite as:", 1)[1].split("In short:", 1)[0]
        assert words(reference["title"]) in text, (page, reference["title"])
        assert str(reference["year"]) in cite_as and reference["url"] in text
        (arxiv,) = [i["value"] for i in reference["identifiers"]]
        assert arxiv in cite_as and reference["url"].endswith(arxiv.removeprefix("arXiv:"))
        listed = text.split("Authors:", 1)[1].split("Cite as:", 1)[0]
        for author in reference["authors"]:
            name = f"{author['given-names']} {author['family-names']}"
            assert re.search(rf"\b{re.escape(name)}\b", listed), (page, name)
