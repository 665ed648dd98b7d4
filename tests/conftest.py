"""Shared fixtures: a private cache dir, so tests never write to the user's home."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FEDAPP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fedapp-cache"))


@pytest.fixture(scope="session")
def clip():
    """The tiny random-init open_clip model (loaded once; no network)."""
    from fedapp.models import TINY_CLIP, load_open_clip  # noqa: PLC0415 - only tests that use it pay the import

    return load_open_clip(TINY_CLIP)
