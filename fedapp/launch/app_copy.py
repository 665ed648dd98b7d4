"""The app folder as ``flwr run`` packs it, without the folders it would only walk past.

``flwr run <app>`` builds the app's FAB by walking every file under the folder and
then keeping the app's sources (``*.py``, ``*.toml``, ``*.yaml``, ... minus what the
``.gitignore`` and Flower's own rules leave out). A checkout with its virtual
environment inside (``.venv``, as the README installs it) holds some 70,000 files:
walking them took 4 s of every launch on a 2-core machine, for a 1.4 MB FAB. The
launcher hands ``flwr run`` a copy of just the files Flower would pack, found by a
walk that does not enter ignored folders; Flower then packs the same FAB from it
(tests/unit/test_launch.py compares the two byte for byte).

Flower accepts a ``--run-config`` key only if the app's ``pyproject.toml`` declares it, and ours
declares the keys of fedapp's own methods; the copy's table also gets the keys that the methods
of installed plug-in packages declare (:func:`declare_plugin_keys`), so that ``python -m
fedapp.launch --run-config`` sets those as it sets ours.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pathspec
import tomllib
from flwr.supercore.constant import APP_PUBLISH_INCLUDE_PATTERNS

# Folders no app file lives in (Flower leaves out .venv and .flwr itself; .git holds no sources).
NEVER_ENTERED = frozenset({".git", ".venv", ".flwr", "__pycache__"})


def _ignored_folders(app_dir: Path) -> pathspec.PathSpec:
    gitignore = app_dir / ".gitignore"
    lines = gitignore.read_text(encoding="utf-8").splitlines() if gitignore.is_file() else []
    return pathspec.GitIgnoreSpec.from_lines(lines)


def app_files(app_dir: Path) -> list[str]:
    """Relative paths of the files under ``app_dir`` that Flower's FAB can hold: its include
    patterns, outside the folders the ``.gitignore`` ignores (never entered)."""
    ignored, include = _ignored_folders(app_dir), pathspec.GitIgnoreSpec.from_lines(APP_PUBLISH_INCLUDE_PATTERNS)
    found: list[str] = []
    for folder, subfolders, files in os.walk(app_dir):
        relative = Path(folder).relative_to(app_dir)
        subfolders[:] = [
            name
            for name in subfolders
            if name not in NEVER_ENTERED and not ignored.match_file(f"{(relative / name).as_posix()}/")
        ]
        found += [path for name in files if include.match_file(path := (relative / name).as_posix())]
    return sorted(found)


def copy_app(app_dir: Path, into: Path) -> Path:
    """Copy :func:`app_files` of ``app_dir`` to ``into`` (replaced if there) and return it."""
    if into.exists():
        shutil.rmtree(into)
    for relative in app_files(app_dir):
        target = into / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(app_dir / relative, target)
    return into


CONFIG_TABLE = "[tool.flwr.app.config]"


def declare_plugin_keys(pyproject: Path, defaults: Mapping[str, str]) -> list[str]:
    """Add to ``pyproject``'s ``[tool.flwr.app.config]`` table each key of ``defaults`` (a key's TOML
    value, by config name) that it does not declare, right under the table's header; return them."""
    text = pyproject.read_text(encoding="utf-8")
    declared = tomllib.loads(text).get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    missing = [key for key in defaults if key not in declared]
    lines = text.splitlines(keepends=True)
    if missing:
        header = next(index for index, line in enumerate(lines) if line.strip() == CONFIG_TABLE)
        lines[header + 1 : header + 1] = [f"{key} = {defaults[key]}\n" for key in missing]
        pyproject.write_text("".join(lines), encoding="utf-8")
    return missing
