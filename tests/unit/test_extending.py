"""docs/extending.md's list of the files that add a method in a package of one's own is true:
FedPer, its worked example (examples/fedper), lives in exactly those files, and the code the
page shows is the code they hold."""

from __future__ import annotations

import re

from tests.paths import ROOT

PAGE = ROOT / "docs" / "extending.md"
EXAMPLE = "fedper"
SCANNED = ("fedapp", "strategies", "clients", "conf", "docs", "tests", "benchmarks", "docker", ".ci", "examples")
ROOT_FILES = ("README.md", "mkdocs.yml", "pyproject.toml")
PACKAGE = "examples/fedper/fedapp_fedper"
SHOWN_FILES = (
    f"{PACKAGE}/base_layers.py",
    f"{PACKAGE}/options.py",
    f"{PACKAGE}/strategy.py",
    f"{PACKAGE}/client.py",
    f"{PACKAGE}/__init__.py",
)


def listed_files(page: str, method: str) -> set[str]:
    """The code spans that start the rows of the page's file table, for ``method``."""
    rows = [
        span for row in re.findall(r"^\| (`[^|]+`) \|", page, re.MULTILINE) for span in re.findall(r"`([^`]+)`", row)
    ]
    return {row.replace("<module>", method.replace("-", "_")).replace("<method>", method) for row in rows}


def files_mentioning(word: str) -> set[str]:
    paths = [path for folder in SCANNED for path in (ROOT / folder).rglob("*") if path.is_file()]
    paths += [ROOT / name for name in ROOT_FILES]
    found = set()
    for path in paths:
        if "__pycache__" in path.parts or path in (PAGE, ROOT / "tests" / "unit" / "test_extending.py"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if re.search(word, text, re.IGNORECASE):
            found.add(path.relative_to(ROOT).as_posix())
    return found


def is_subsequence(lines: list[str], within: list[str]) -> bool:
    remaining = iter(within)
    return all(any(line == other for other in remaining) for line in lines)


def test_the_example_method_lives_in_exactly_the_listed_files():
    listed = listed_files(PAGE.read_text(), EXAMPLE)
    assert len(listed) == 10
    assert files_mentioning(EXAMPLE) == listed


def test_the_page_shows_the_code_those_files_hold():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert len(blocks) == len(SHOWN_FILES)
    for block, name in zip(blocks, SHOWN_FILES, strict=True):
        # (a trailing comma aside: the catalog entry is shown alone, not inside its tuple)
        shown = [line.strip().rstrip(",") for line in block.splitlines() if line.strip()]
        source = [line.strip().rstrip(",") for line in (ROOT / name).read_text().splitlines() if line.strip()]
        assert is_subsequence(shown, source), f"docs/extending.md shows code that {name} does not hold"


def test_the_checks_can_fail():
    assert not is_subsequence(["b", "a"], ["a", "b"])
    assert listed_files("| `clients/<module>.py` | x |\n| `docs/<method>.md` | y |", "pep-fedpt") == {
        "clients/pep_fedpt.py",
        "docs/pep-fedpt.md",
    }
