"""Every method's facts, declared once: the method catalog.

A :class:`MethodSpec` says where a method's two halves live (import paths, so a
client process imports only its own client module), what its clients run and
upload, whether client-level DP and SecAgg+ can protect it, whether it can serve
a client that never trained, and which protocols it supports. The config
validation, the registry, the privacy checks, the report and the docs read these
facts; nothing else keeps lists of method names.

The catalog is filled from the ``fedapp.methods`` entry points of the installed packages:
ours (:mod:`fedapp.builtin_methods`, declared in ``pyproject.toml``) and any package of
yours that declares a ``MethodSpec`` the same way (docs/extending.md), so a method of your own
runs through ``python -m fedapp.launch``, ``flwr run`` and the sweep without a change here.

This module is plain data: it imports neither Flower nor torch.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Literal

from fedapp.options import Key, MethodOptions

Backbone = Literal["cnn", "clip-text", "clip-vision", "cnn+server-clip"]
Uploads = Literal["parameters", "per-class", "nothing"]


@dataclass(frozen=True)
class MethodSpec:
    """One method's facts.

    Attributes
    ----------
    name
        The run-config value of ``method``.
    strategy, client
        ``"module:Class"`` of the server strategy and the edge client.
    summary
        One line: what is shared and how (with the paper's authors and year).
    backbone
        What a client runs: a zoo CNN (``cnn``), a frozen open_clip text tower with
        learned text prompts (``clip-text``), a frozen open_clip ViT image tower
        (``clip-vision``), or a zoo CNN whose server holds CLIP (``cnn+server-clip``).
    uploads
        ``parameters`` (one shared module's float arrays, averaged by examples),
        ``per-class`` (per-class statistics with class counts) or ``nothing``.
    uploads_note
        For methods that do not upload parameters: what they upload instead.
    mixed_models
        Whether clients may run different zoo architectures (nothing model-shaped is averaged).
    new_client_note
        Why the method cannot serve a client that never trained (empty: it can, from
        the server's state alone), shown where held-out accuracy would be.
    variant_of
        The method whose strategy and client this one reuses with other settings
        (empty for a method of its own).
    options
        The :class:`~fedapp.options.MethodOptions` subclass declaring the keys of the method's own
        mechanism (their types, defaults, ranges and checks), declared beside its math; a strategy
        and a client receive an instance as ``self.options``. The methods that do not declare a key
        leave it alone. The base class itself: the method has no keys of its own.
    personal_state
        Whether a client keeps state of its own between rounds (its model, prompt or
        statistics) in its state store, which a resumed run finds again only on disk.
    title
        The method's name in prose and in the docs' index (default: :attr:`name`).
    page
        Its page under ``docs/`` (``methods/sdfed.md``, with an ``#anchor`` for a section of
        another method's page), linked from the method x preset index of the README and the docs,
        and listed in the site's navigation (a page of its own); empty for a method documented
        elsewhere (a plug-in's own README).
    borrowed_presets
        Other methods' presets (``conf/<name>.yaml``) that also run this method, given
        ``method="<name>"``: the index lists them beside the method's own presets, marked †.
    """

    name: str
    strategy: str
    client: str
    summary: str
    backbone: Backbone
    uploads: Uploads
    uploads_note: str = ""
    mixed_models: bool = False
    new_client_note: str = ""
    variant_of: str = ""
    options: type[MethodOptions] = MethodOptions
    personal_state: bool = False
    title: str = ""
    page: str = ""
    borrowed_presets: tuple[str, ...] = ()

    @property
    def averages_parameters(self) -> bool:
        """Uploads one shared module's float arrays that the server averages by examples:
        what client-level DP, SecAgg+ and robust aggregation rules apply to."""
        return self.uploads == "parameters"

    @property
    def names_unseen_classes(self) -> bool:
        """Classifies by class-name prompts, so it can name classes it never trained on
        (the base-to-novel protocol)."""
        return self.backbone == "clip-text"

    @property
    def keys(self) -> tuple[str, ...]:
        """The config names of the keys :attr:`options` declares."""
        return tuple(self.options.config_keys())

    @property
    def module(self) -> str:
        """The Python module name of the method's own files (``pep-fedpt`` -> ``pep_fedpt``)."""
        return self.name.replace("-", "_")


ENTRY_POINT_GROUP = "fedapp.methods"
"""The entry-point group a package declares its methods in: ``<method> = "<module>:<MethodSpec object>"``."""

DISTRIBUTION = "fedapp"


def _load_entry_points() -> tuple[dict[str, MethodSpec], dict[str, str]]:
    """Every method the installed packages declare, ours first in the order we declare them, then
    the others' by name; and, by method name, why an entry point that names one could not be used."""
    found: dict[str, tuple[bool, MethodSpec]] = {}
    problems: dict[str, str] = {}
    points = list(entry_points(group=ENTRY_POINT_GROUP))
    if not any(point.dist and point.dist.name == DISTRIBUTION for point in points):
        # A checkout on PYTHONPATH, not installed, has no entry points of ours: read the same table.
        points[:0] = [
            EntryPoint(spec.name, f"fedapp.builtin_methods:{spec.name.upper().replace('-', '_')}", ENTRY_POINT_GROUP)
            for spec in import_module("fedapp.builtin_methods").BUILTIN
        ]
    for point in points:
        ours = point.dist is None or point.dist.name == DISTRIBUTION
        where = f"method {point.name!r} of {point.dist.name if point.dist else DISTRIBUTION} ({point.value})"
        try:
            spec = point.load()
        except Exception as error:  # a broken plug-in must not stop the other methods
            problems[point.name] = f"{where} does not load: {type(error).__name__}: {error}"
            continue
        if not isinstance(spec, MethodSpec):
            problems[point.name] = f"{where} is a {type(spec).__name__}, not a fedapp.catalog.MethodSpec"
        elif spec.name != point.name:
            problems[point.name] = f"{where} is a MethodSpec named {spec.name!r}"
        elif point.name in found and found[point.name][1] is not spec:
            problems[point.name] = f"{where}: another package declares a method of that name"
        elif not (isinstance(spec.options, type) and issubclass(spec.options, MethodOptions)):
            problems[point.name] = f"{where}: its options {spec.options!r} are not a fedapp.options.MethodOptions class"
        else:
            found[point.name] = (ours, spec)
    # Entry points come sorted by name; ours keep the order of their table, which the docs follow.
    table = [spec.name for spec in import_module("fedapp.builtin_methods").BUILTIN]
    ours = sorted((name for name in found if found[name][0]), key=table.index)
    order = ours + sorted(name for name in found if not found[name][0])
    catalog = {name: found[name][1] for name in order if name not in problems}
    problems |= _key_problems(catalog)
    return {name: spec for name, spec in catalog.items() if name not in problems}, problems


def _key_problems(catalog: Mapping[str, MethodSpec]) -> dict[str, str]:
    """By method name, why its declared keys cannot join the others': a field that is not a key, or a
    key an earlier method declares with another type, default or range (the run configuration is flat)."""
    declared: dict[str, tuple[str, Key]] = {}
    problems: dict[str, str] = {}
    for name, spec in catalog.items():
        try:
            keys = spec.options.config_keys()
        except Exception as error:  # a plug-in's malformed options must not stop the other methods
            problems[name] = f"method {name!r}: its options {spec.options.__name__} do not declare keys: {error}"
            continue
        clash = next((key for key in keys if key in declared and not keys[key].same_as(declared[key][1])), None)
        if clash is not None:
            problems[name] = (
                f"method {name!r} declares key {clash!r} unlike method {declared[clash][0]!r} does "
                "(one key, one type, default and range)"
            )
            continue
        for key, declaration in keys.items():
            declared.setdefault(key, (name, declaration))
    return problems


@functools.cache
def _catalog() -> tuple[dict[str, MethodSpec], dict[str, str]]:
    # Built on first use, not on import: a package that declares methods imports MethodSpec from here,
    # and loading its entry point while this module or that package is still importing would find
    # them half made (importing fedapp.builtin_methods or a plug-in first did).
    return _load_entry_points()


if TYPE_CHECKING:
    CATALOG: dict[str, MethodSpec]
    CATALOG_PROBLEMS: dict[str, str]
    METHODS: tuple[str, ...]


def __getattr__(name: str) -> Any:
    """``CATALOG`` (method name -> MethodSpec), ``CATALOG_PROBLEMS`` (method name -> why its entry point
    could not be used) and ``METHODS`` (the names in catalog order), built on first use."""
    if name == "CATALOG":
        return _catalog()[0]
    if name == "CATALOG_PROBLEMS":
        return _catalog()[1]
    if name == "METHODS":
        return tuple(_catalog()[0])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def methods_where(**facts: object) -> tuple[str, ...]:
    """The methods whose spec has every given attribute value, in catalog order:
    ``methods_where(backbone="clip-text")``, ``methods_where(averages_parameters=True)``."""
    return tuple(name for name, spec in _catalog()[0].items() if all(getattr(spec, k) == v for k, v in facts.items()))
