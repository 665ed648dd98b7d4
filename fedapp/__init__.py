"""Flower federated-learning app for parameter-efficient adaptation.

The strategies and clients are ``fedapp.strategies`` and ``fedapp.clients``
(``from fedapp.strategies import SDFedStrategy``). The repository keeps them in its
top-level ``strategies/`` and ``clients/`` folders: the wheel maps the folders into
this package (``[tool.setuptools.package-dir]``), and a checkout, or a FAB built from
one, maps them here, so that a user's own ``strategies.py`` or ``clients/`` never
collides with ours.

``fedapp.load_model(run_dir, client=None)`` loads a finished run's exported model
(:func:`fedapp.inference.load_model`); it is imported on first use, so that
``import fedapp`` stays light.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedapp.inference import load_model

__all__ = ["load_model"]

# The subpackages a checkout keeps beside this folder rather than in it.
CHECKOUT_FOLDERS = ("strategies", "clients")


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    """Finds ``fedapp.strategies`` and ``fedapp.clients`` in a checkout's top-level folders."""

    def __init__(self, folders: dict[str, Path]) -> None:
        self.folders = folders

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def _map_checkout_folders() -> None:
    here = Path(__file__).resolve().parent
    # An installed wheel holds the folders inside this package: nothing to map.
    folders = {
        f"{__name__}.{name}": here.parent / name
        for name in CHECKOUT_FOLDERS
        if not (here / name).is_dir() and (here.parent / name / "__init__.py").is_file()
    }
    if folders and not any(isinstance(finder, _CheckoutFolders) for finder in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFolders(folders))


_map_checkout_folders()


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from fedapp.inference import load_model  # noqa: PLC0415 - lazy: torch and the clients only when asked

        return load_model
    raise AttributeError(f"module 'fedapp' has no attribute {name!r}")
