"""Shared fixtures: a private cache dir, so tests never write to the user's home."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FEDAPP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fedapp-cache"))
