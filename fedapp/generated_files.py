"""The repository files made from the method catalog and the schema, so that adding a method is its own files.

A method's own files and its entry point are all it takes (docs/extending.md); these follow from
them, and a unit test fails while one is out of date:

* the method x preset index of ``README.md`` and ``docs/index.md`` (a row per method page: its
  presets, from the ``conf/*.yaml`` that name the method, and those of others it borrows);
* the *Methods* section of ``mkdocs.yml``'s navigation (a page of its own per row);
* ``[tool.flwr.app.config]`` in ``pyproject.toml``: every key at its default, so that Flower's
  ``flwr run`` accepts them (:func:`fedapp.config.defaults`);
* ``docs/configuration.md`` (:mod:`fedapp.config.reference`).

``python -m fedapp.generated_files --write`` rewrites them in a checkout; ``--check`` says which
differ. Only our own methods are listed: a plug-in's page is its package's README.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from fedapp.catalog import CATALOG, MethodSpec
from fedapp.config import APP_ROOT, defaults
from fedapp.config.reference import render as render_reference
from fedapp.config.schema import RESERVE_BACKBONE
from fedapp.options import Scalar, toml_value

COMMAND = "python -m fedapp.generated_files --write"
INDEX_HEADER = "| method (`method=`) | digits, offline | CIFAR-10 | paper's setting | docs |"
COLUMNS = ("digits, offline", "CIFAR-10", "paper's setting")
CONFIG_TABLE = "[tool.flwr.app.config]"


def _ours() -> list[MethodSpec]:
    from fedapp.builtin_methods import BUILTIN  # noqa: PLC0415 - the table, for its order

    return [spec for spec in BUILTIN if spec.name in CATALOG and spec.page]


def _presets(root: Path) -> dict[str, dict[str, Scalar]]:
    """Every preset of ``conf/``, by name, as its keys."""
    return {path.stem: yaml.safe_load(path.read_text(encoding="utf-8")) for path in sorted(root.glob("conf/*.yaml"))}


def preset_column(preset: dict[str, Scalar]) -> str:
    """The index column of a preset: weights it does not make itself (an open_clip tag) are the paper's
    setting, else digits is the offline column and any other data set CIFAR-10's."""
    if preset.get("pretrained", "") not in ("", RESERVE_BACKBONE):
        return COLUMNS[2]
    return COLUMNS[0] if preset.get("dataset", "digits") == "digits" else COLUMNS[1]


def _cell(names: list[str], borrowed: set[str], presets: dict[str, dict[str, Scalar]]) -> str:
    def shown(name: str) -> str:
        note = " (CIFAR-100)" if presets[name].get("dataset") == "cifar100" and name not in borrowed else ""
        return f"`{name}`{'†' if name in borrowed else ''}{note}"

    return ", ".join(shown(name) for name in names)


def index_rows(root: Path = APP_ROOT, docs_prefix: str = "") -> list[str]:
    """The method x preset table, header included: a row per docs page (methods that share one,
    the variants, share a row), its own presets first (``<method>-*`` before the others), then those
    it borrows (†)."""
    presets = _presets(root)
    rows: dict[str, list[MethodSpec]] = {}
    for spec in _ours():
        rows.setdefault(spec.page, []).append(spec)
    lines = [INDEX_HEADER, "|---|---|---|---|---|"]
    for page, specs in rows.items():
        names = [spec.name for spec in specs]
        own = sorted(
            (name for name, preset in presets.items() if preset.get("method") in names),
            key=lambda name: (not any(name.startswith(f"{method}-") for method in names), name),
        )
        borrowed = [
            name for name in dict.fromkeys(p for spec in specs for p in spec.borrowed_presets) if name in presets
        ]
        listed = [*own, *borrowed]
        cells = [
            _cell([name for name in listed if preset_column(presets[name]) == column], set(borrowed), presets)
            for column in COLUMNS
        ]
        methods = ", ".join(f"`{name}`" for name in names)
        link = f"[{', '.join(spec.title or spec.name for spec in specs)}]({docs_prefix}{page})"
        lines.append(f"| {methods} | {' | '.join(cells)} | {link} |".replace("|  |", "| |"))
    return lines


def nav_lines() -> list[str]:
    """``mkdocs.yml``'s *Methods* entries: one per page of its own (a section of another page is not)."""
    pages: dict[str, list[str]] = {}
    for spec in _ours():
        if "#" not in spec.page:
            pages.setdefault(spec.page, []).append(spec.title or spec.name)
    lines = []
    for page, titles in pages.items():
        title = " and ".join(titles)
        if title.split()[0].islower():  # "local VPT" heads its entry as "Local VPT"; "pFedLoRA" stays
            title = title[0].upper() + title[1:]
        lines.append(f"      - {title}: {page}")
    return lines


def _replace_block(text: str, start: Callable[[str], bool], inside: Callable[[str], bool], new: list[str]) -> str:
    """``text`` with the lines after the first line ``start`` accepts, as long as ``inside`` accepts
    them, replaced by ``new``."""
    lines = text.splitlines()
    first = next(index for index, line in enumerate(lines) if start(line)) + 1
    last = first
    while last < len(lines) and inside(lines[last]):
        last += 1
    return "\n".join([*lines[:first], *new, *lines[last:]]) + "\n"


def generated(root: Path = APP_ROOT) -> dict[Path, str]:
    """Each generated file's path and the text it should hold, from the files as they are."""
    readme, index = root / "README.md", root / "docs" / "index.md"
    mkdocs, pyproject = root / "mkdocs.yml", root / "pyproject.toml"

    def table(path: Path, prefix: str) -> str:
        rows = index_rows(root, prefix)
        text = path.read_text(encoding="utf-8")
        return _replace_block(text, lambda line: line == INDEX_HEADER, lambda line: line.startswith("|"), rows[1:])

    config = [f"{key} = {toml_value(value)}" for key, value in defaults().items()]
    return {
        readme: table(readme, "docs/"),
        index: table(index, ""),
        mkdocs: _replace_block(
            mkdocs.read_text(encoding="utf-8"),
            lambda line: line == "  - Methods:",
            lambda line: line.startswith("      - "),
            nav_lines(),
        ),
        pyproject: _replace_block(
            pyproject.read_text(encoding="utf-8"), lambda line: line == CONFIG_TABLE, bool, config
        ),
        root / "docs" / "configuration.md": render_reference(),
    }


def out_of_date(root: Path = APP_ROOT) -> list[Path]:
    """The generated files whose text differs from what the catalog and schema give."""
    return [path for path, text in generated(root).items() if path.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    """``--write`` rewrites the generated files; ``--check`` (the default) lists those out of date
    and exits 1 if there are any."""
    parser = argparse.ArgumentParser(prog="python -m fedapp.generated_files", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the files that are out of date")
    args = parser.parse_args(argv)
    stale = out_of_date()
    if args.write:
        for path, text in generated().items():
            if path in stale:
                path.write_text(text, encoding="utf-8")
                print(f"written: {path.relative_to(APP_ROOT)}")
        return 0
    for path in stale:
        print(f"out of date: {path.relative_to(APP_ROOT)} (run {COMMAND})", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
