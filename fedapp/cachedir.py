"""Where the project caches what it can make again (decoded datasets, partitions, pretrained
backbones, the launcher's record of data already checked), without importing torch or numpy, so
that the launcher can find it too."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV_VAR", "DEFAULT_CACHE_DIR", "resolve_cache_dir"]

CACHE_ENV_VAR = "FEDAPP_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/fedapp")


def resolve_cache_dir(cache_dir: str = "") -> Path:
    """Where decoded datasets and extracted archives are cached.

    Parameters
    ----------
    cache_dir : str
        Explicit folder; wins over the ``FEDAPP_CACHE_DIR`` environment variable,
        which wins over ``~/.cache/fedapp``.

    Returns
    -------
    Path
        The (not necessarily existing) absolute cache folder.
    """
    chosen = cache_dir or os.environ.get(CACHE_ENV_VAR, "") or str(DEFAULT_CACHE_DIR)
    return Path(chosen).expanduser().resolve()
