"""Each method declares the keys of its own mechanism (``MethodSpec.keys``), and a run that sets
another method's key is told, by name, that its method does not read it (issue 63). The
declarations are kept true to the code: a key a method's strategy or client reads is declared,
and a declared key is read."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from fedapp.catalog import CATALOG, METHODS
from fedapp.config import defaults, unread_keys_warning, unread_method_keys

ROOT = Path(__file__).resolve().parents[2]
METHOD_KEYS = sorted({key for spec in CATALOG.values() for key in spec.keys})


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def source_of(method: str) -> str:
    """The source of the method's strategy and client classes and of every class of ours they
    inherit from, and of its options class (whose checks read its keys)."""
    spec = CATALOG[method]
    parts = []
    for path in (spec.strategy, spec.client):
        ours = [c for c in _load(path).__mro__ if c.__module__.split(".")[0] in ("strategies", "clients", "fedapp")]
        parts += [inspect.getsource(c) for c in ours]
    parts += [inspect.getsource(c) for c in spec.options.__mro__ if c.__module__.startswith("fedapp.methods")]
    return "\n".join(parts)


def reads(source: str, key: str) -> bool:
    return bool(re.search(rf"\.{key.replace('-', '_')}\b", source) or f'"{key}"' in source)


@pytest.mark.parametrize("method", METHODS)
def test_every_key_of_a_method_s_mechanism_that_its_code_reads_is_declared(method):
    source = source_of(method)
    read = {key for key in METHOD_KEYS if reads(source, key)}
    if method == "fedd2p-agg":  # one strategy with fedd2p's; it returns before the generator's keys
        read -= set(CATALOG["fedd2p"].keys) - set(CATALOG[method].keys)
    assert read <= set(CATALOG[method].keys), f"{method} reads {sorted(read - set(CATALOG[method].keys))}"


@pytest.mark.parametrize("method", [m for m in METHODS if CATALOG[m].keys])
def test_every_declared_key_is_read_by_the_method_s_code(method):
    # A visual-prompt method's prompts are built from the run's values by name (visual_prompts.py).
    builds_prompts = CATALOG[method].backbone == "clip-vision"
    source = source_of(method) + (ROOT / "fedapp/methods/visual_prompts.py").read_text() * builds_prompts
    assert [key for key in CATALOG[method].keys if not reads(source, key)] == []


def test_a_fedavg_run_given_other_methods_keys_is_told_which_it_does_not_read():
    values = {**defaults(), "proto-weight": 2.0, "sdfed-lambda": 0.3, "adapter-hidden": 80}
    assert unread_method_keys(values) == {
        "sdfed-lambda": ("sdfed",),
        "adapter-hidden": ("pfedlora",),
        "proto-weight": ("fedproto",),
    }
    assert unread_keys_warning(values) == (
        "warning: fedavg does not read sdfed-lambda (read by sdfed), adapter-hidden (read by pfedlora), "
        "proto-weight (read by fedproto): the run computes as without them"
    )


def test_a_method_s_own_keys_and_keys_left_at_their_defaults_draw_no_warning():
    assert unread_keys_warning({**defaults(), "method": "fedproto", "proto-weight": 2.0}) is None
    assert unread_keys_warning({**defaults(), "method": "sdfed"}) is None
    # fml and fedkd share shared-model and kd-temperature; fd reads kd-temperature too.
    assert unread_method_keys({**defaults(), "method": "fd", "kd-temperature": 3.0, "shared-model": "cnn-1"}) == {
        "shared-model": ("fml", "fedkd")
    }
