"""How a configuration key is declared: :class:`Key`, :func:`setting`, and :class:`MethodOptions`.

The run configuration is flat for the user (``--run-config 'projector-mode="rank"'``, as
Flower's convention is), but its keys are declared in two places: the keys every run reads
(:class:`fedapp.config.Settings`) and each method's own, declared beside its math as a frozen
dataclass deriving from :class:`MethodOptions` and named by the method's
:class:`~fedapp.catalog.MethodSpec`. A field's type is its key's type, a ``Literal`` its
choices; :func:`setting` adds the default, the description and the range. The schema, the
validation, ``pyproject.toml``'s defaults and the configuration reference are made from both.

Plain Python: this module imports neither the configuration, nor Flower, nor torch.
"""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar

import tomli_w

from fedapp.errors import ConfigError

Scalar = bool | int | float | str
_Options = TypeVar("_Options", bound="MethodOptions")


@dataclass(frozen=True)
class Key:
    """One run-config key: its type, default, and what values it accepts."""

    type: type
    default: Scalar
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    unavailable: Mapping[str, str] | None = None  # value -> why it is not a choice (a broken plug-in)
    names: Literal["", "zoo-model", "zoo-models"] = ""  # a zoo model (or a comma list), which a rule checks

    def check(self, name: str, value: Any) -> Scalar:
        """Return ``value`` coerced to this key's type, or raise ConfigError."""
        value = _coerce(name, value, self.type)
        if self.unavailable and value in self.unavailable:
            raise ConfigError(f"config key '{name}' = {value!r} cannot run: {self.unavailable[value]}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"config key '{name}' = {value!r} is not one of: {', '.join(self.choices)}"
                f"{did_you_mean(str(value), self.choices)}"
            )
        if self.type in (int, float):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"config key '{name}' = {value!r} must be a finite number")
            if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
                bound = f"> {self.low}" if self.low_open else f">= {self.low}"
                raise ConfigError(f"config key '{name}' = {value!r} must be {bound}")
            if self.high is not None and value > self.high:
                raise ConfigError(f"config key '{name}' = {value!r} must be <= {self.high}")
        return value

    def same_as(self, other: Key) -> bool:
        """Whether two declarations of one key agree on everything but their description."""
        return (self.type, self.default, self.choices, self.low, self.high, self.low_open) == (
            other.type,
            other.default,
            other.choices,
            other.low,
            other.high,
            other.low_open,
        )


def close_match(word: str, candidates: Iterable[str]) -> str | None:
    """The one of ``candidates`` that ``word`` most likely misspells, or None.

    Case is ignored (``FedAvg`` finds ``fedavg``). The similarity cutoff is 0.75, above difflib's
    0.6: a distinct name that merely shares letters (``fedsgd`` and ``fedkd``) is no typo.
    """
    by_folded = {candidate.casefold(): candidate for candidate in candidates}
    found = difflib.get_close_matches(word.casefold(), by_folded, n=1, cutoff=0.75)
    return by_folded[found[0]] if found else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``": did you mean 'x'?"`` to end an error about ``word`` when ``x`` is a close match, else ``""``."""
    match = close_match(word, candidates)
    return f": did you mean '{match}'?" if match is not None else ""


def _coerce(name: str, value: Any, kind: type) -> Scalar:
    # bool is a subclass of int: refuse it for numeric keys explicitly.
    is_bool = isinstance(value, bool)
    if kind is bool and is_bool:
        return value
    if kind is int and isinstance(value, int) and not is_bool:
        return value
    if kind is float and isinstance(value, int | float) and not is_bool:
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    raise ConfigError(f"config key '{name}' = {value!r} has type {type(value).__name__}, expected {kind.__name__}")


def toml_value(value: object) -> str:
    """``value`` as a TOML value, as ``pyproject.toml`` and ``flwr run --run-config`` write it (``"a b"``,
    ``3``, ``true``)."""
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def setting(
    default: Scalar,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    unavailable: Mapping[str, str] | None = None,
    names: Literal["", "zoo-model", "zoo-models"] = "",
) -> Any:
    """One run-config key as a dataclass field: its default, help and allowed range.

    A field typed ``Literal["a", "b"]`` takes its choices from the type; ``choices`` is for a set
    known only when the module runs (the catalog's methods). ``names`` says that the value names a
    model of the zoo (``zoo-model``) or a comma list of them (``zoo-models``), for the reference.
    """
    metadata = {"help": help, "choices": choices, "low": low, "high": high, "low_open": low_open}
    return field(default=default, metadata={**metadata, "unavailable": unavailable, "names": names})


def config_name(attribute: str) -> str:
    """The key a dataclass field stands for: ``num_rounds`` -> ``num-rounds``."""
    return attribute.replace("_", "-")


def declared_keys(declaring: type) -> dict[str, Key]:
    """The keys a dataclass of :func:`setting` fields declares, by config name, in field order."""
    hints = typing.get_type_hints(declaring)
    keys: dict[str, Key] = {}
    for spec in fields(declaring):
        if spec.name not in hints or not spec.metadata:
            continue
        kind, metadata = hints[spec.name], dict(spec.metadata)
        if typing.get_origin(kind) is Literal:
            metadata["choices"] = tuple(typing.get_args(kind))
            kind = type(metadata["choices"][0])
        if kind not in (bool, int, float, str):
            raise TypeError(f"{declaring.__name__}.{spec.name}: a key's type is bool, int, float, str or a Literal")
        keys[config_name(spec.name)] = Key(kind, spec.default, **metadata)
    return keys


@dataclass(frozen=True)
class MethodOptions:
    """The keys of one method's own mechanism; a method with none uses this class as it is.

    Subclass it beside the method's math, one :func:`setting` field per key (a key ``sdfed-lambda``
    is the field ``sdfed_lambda``), and name the subclass in the method's ``MethodSpec(options=...)``.
    A strategy and a client receive an instance as ``self.options``, built from the run's values.
    Two methods may declare one key (FD and FML both read ``kd-temperature``) when they agree on
    its type, default and range; an option class may derive from another to share its keys.

    ``title`` and ``about`` (Markdown) head the method's section of the configuration reference.
    """

    title: ClassVar[str] = ""
    about: ClassVar[str] = ""

    @classmethod
    def config_keys(cls) -> dict[str, Key]:
        """The keys this class declares, by config name."""
        return declared_keys(cls)

    @classmethod
    def from_values(cls: type[_Options], values: Mapping[str, Any]) -> _Options:
        """The options that ``values`` (a checked run configuration by config name) sets; every key
        this class declares must be among them."""
        return cls(**{spec.name: values[config_name(spec.name)] for spec in fields(cls) if spec.metadata})

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise a ConfigError naming a key whose value cannot run, ``values`` being the whole run
        configuration by config name (for keys that depend on others: the model, the clients).
        Runs after every key was checked alone; the rules of the common keys ran before."""

    def text_prompt_lengths(self, values: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
        """The text prompts a client reads besides ``prompt-length``'s, as ``(what, length per
        client)``, so that one rule checks every prompt against the text tower's context."""
        return []
