"""The documentation: docs/ builds as an MkDocs site in strict mode, the README stays short and its links resolve.

``mkdocs build --strict`` fails on a link to a missing page or anchor and on a page left out of ``nav``
(``validation`` in ``mkdocs.yml``); the other checks need no MkDocs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.paths import ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_LIMIT = 15_000  # bytes

# Developers' private material that the repository must never point at (spelt in pieces so that
# this file does not name it either).
PRIVATE = (".." + "/shared", "/work" + "/shared", "METHODS" + ".md")

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_links(markdown: str) -> list[str]:
    """Targets of the Markdown links and images in ``markdown`` that point into the repository.

    Code blocks and code spans are not links; web addresses, mail addresses and in-page anchors are
    left out. A target keeps its path only (no ``#anchor`` or ``?query``).
    """
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = LINK.findall(text) + REFERENCE.findall(text)
    paths = []
    for target in targets:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "//")):
            continue
        paths.append(re.split(r"[#?]", target, maxsplit=1)[0])
    return paths


def nav_pages(nav) -> list[str]:
    """Every page path in an ``mkdocs.yml`` nav (nested sections included; external links left out)."""
    if isinstance(nav, str):
        return [] if re.match(r"^[a-z]+://", nav) else [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def repository_text_files() -> list[Path]:
    """README, every file under docs/, mkdocs.yml, and every file git tracks or would add (not ignored)."""
    files = {README, ROOT / "mkdocs.yml", *(p for p in DOCS.rglob("*") if p.is_file())}
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=False, timeout=60,
    )  # fmt: skip
    if listed.returncode == 0:
        files |= {ROOT / name for name in listed.stdout.decode().split("\0") if name}
    else:  # not a git checkout (an unpacked sdist): the documentation is still checked
        assert not (ROOT / ".git").exists(), listed.stderr.decode()
    texts = []
    for path in sorted(files):
        if path.is_file() and b"\0" not in path.read_bytes()[:8192]:
            texts.append(path)
    return texts


def test_the_site_builds_in_strict_mode(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2.0, not a warning of ours
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (site / "index.html").is_file()
    assert (site / "methods" / "sdfed" / "index.html").is_file()


def test_the_readme_is_short():
    size = README.stat().st_size
    assert size < README_LIMIT, f"README.md is {size:,} bytes; move detail into docs/ (limit {README_LIMIT:,})"


def test_nothing_points_at_the_developers_private_material():
    files = repository_text_files()
    assert README in files and DOCS / "index.md" in files and ROOT / "mkdocs.yml" in files
    found = [
        f"{path.relative_to(ROOT)}: {needle}"
        for path in files
        for needle in PRIVATE
        if needle in path.read_bytes().decode("utf-8", errors="replace")
    ]
    assert not found, found


def test_the_nav_lists_every_page_and_only_pages_that_exist():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    listed = nav_pages(config["nav"])
    assert listed, "mkdocs.yml has no nav"
    assert len(listed) == len(set(listed)), [page for page in listed if listed.count(page) > 1]
    missing = [page for page in listed if not (DOCS / page).is_file()]
    assert not missing, f"in nav but not under docs/: {missing}"
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert pages
    unlisted = sorted(set(pages) - set(listed))
    assert not unlisted, f"under docs/ but not in mkdocs.yml's nav: {unlisted}"


def test_every_relative_link_in_the_readme_resolves():
    links = relative_links(README.read_text())
    assert any(link.startswith("docs/") for link in links), "the README links into docs/"
    broken = [link for link in links if not (ROOT / link).exists()]
    assert not broken, f"README.md links to missing files: {broken}"


def test_the_link_reader_finds_links_and_skips_code_and_web_addresses():
    text = (
        '[a](docs/a.md) ![b](docs/b.png "title") [c](https://flower.ai) [d](#top) [e](docs/e.md#part)\n'
        "`[f](docs/f.md)`\n```\n[g](docs/g.md)\n```\n[h]: docs/h.md\n[i](mailto:someone@example.org)\n"
    )
    assert relative_links(text) == ["docs/a.md", "docs/b.png", "docs/e.md", "docs/h.md"]
    assert nav_pages([{"Home": "index.md"}, {"Methods": [{"A": "methods/a.md"}, "b.md"]}, {"X": "https://x.org"}]) == [
        "index.md",
        "methods/a.md",
        "b.md",
    ]
