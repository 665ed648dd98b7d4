"""Flower federated-learning app for parameter-efficient adaptation.

``fedapp.load_model(run_dir, client=None)`` loads a finished run's exported model
(:func:`fedapp.inference.load_model`); it is imported on first use, so that
``import fedapp`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedapp.inference import load_model

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from fedapp.inference import load_model  # noqa: PLC0415 - lazy: torch and the clients only when asked

        return load_model
    raise AttributeError(f"module 'fedapp' has no attribute {name!r}")
