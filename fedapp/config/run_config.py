"""A validated run configuration and how one is made: presets, overrides, validation, digests.

:class:`~fedapp.config.validated.RunConfig` (defined apart, so that the rules can name it)
is a :class:`~fedapp.config.schema.Settings` whose values have been checked.
:func:`resolve_run_config` layers the selected YAML preset under the
explicit overrides and :func:`validate` checks every key, then the cross-key rules
(:mod:`fedapp.config.rules`), before any data is touched or any model is built.
:func:`settings_digest` and :func:`same_setting_key` tell which runs repeat one setting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fedapp.config.key_groups import NOT_SETTINGS, STORAGE_KEYS
from fedapp.config.rules import CROSS_RULES
from fedapp.config.schema import APP_ROOT, SCHEMA, defaults
from fedapp.config.validated import RunConfig
from fedapp.errors import ConfigError
from fedapp.options import close_match

UNCOMPARED = NOT_SETTINGS | STORAGE_KEYS
"""Keys that :func:`same_setting_key` leaves out: two runs differing only in them repeat one setting."""


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every schema key it lacks at its default: a run made before a key existed
    ran as that default (report seed groups and sweeps compare runs this way)."""
    return {**defaults(), **config}


def same_setting_key(config: Mapping[str, Any]) -> str:
    """A text equal for two configs exactly when they differ only in :data:`NOT_SETTINGS` (seed aside)
    and :data:`STORAGE_KEYS`."""
    settings = {key: value for key, value in with_defaults(config).items() if key not in UNCOMPARED}
    return json.dumps(settings, sort_keys=True, default=str)


def find_preset(path: str) -> Path:
    """Locate a preset file given as absolute, relative to the CWD, or to the app."""
    candidates = [Path(path).expanduser()]
    if not candidates[0].is_absolute():
        candidates.append(APP_ROOT / path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config key 'preset' = {path!r}: file not found (looked in {candidates})")


class _PresetLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error, not the last one winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                first, second = (self.construct_object(n, deep=True) for n in (seen[key], value_node))
                raise DuplicateKeyError(
                    f"gives {key!r} twice (line {seen[key].start_mark.line + 1}: {first!r}, "
                    f"line {value_node.start_mark.line + 1}: {second!r}); keep one"
                )
            seen[key] = value_node
        return super().construct_mapping(node, deep=deep)


class DuplicateKeyError(yaml.YAMLError):
    """A preset that gives one key twice."""


def load_preset(path: str) -> dict[str, Any]:
    """Read a YAML preset: a flat mapping of config keys to scalar values, each key once."""
    file = find_preset(path)
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_PresetLoader) or {}  # a SafeLoader
    except DuplicateKeyError as err:
        raise ConfigError(f"config key 'preset' = {path!r} {err}") from err
    except UnicodeDecodeError as err:
        bad = err.object[err.start : err.start + 1]
        raise ConfigError(f"config key 'preset' = {path!r}: not UTF-8 text (byte {err.start}: {bad!r})") from err
    except OSError as err:
        raise ConfigError(f"config key 'preset' = {path!r}: cannot be read ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"config key 'preset' = {path!r}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config key 'preset' = {path!r}: expected a mapping of keys to values")
    if "preset" in data:
        raise ConfigError(f"config key 'preset' = {path!r}: a preset may not name another preset")
    return data


def unknown_keys_error(unknown: list[str], *, where: str = "", list_valid: bool = False) -> ConfigError:
    """The error for run-config keys that are not in the schema, with the key each one likely misspells.

    One misspelt key: ``unknown config key 'num-round': did you mean 'num-rounds'?``. Otherwise
    every unknown key, each followed by its close match if it has one, and (``list_valid``) the valid keys.
    ``where`` follows the word "key(s)" (e.g. ``" in preset 'x.yaml'"``).
    """
    matches = {key: close_match(key, SCHEMA) for key in unknown}
    if len(unknown) == 1 and matches[unknown[0]] is not None:
        return ConfigError(f"unknown config key '{unknown[0]}'{where}: did you mean '{matches[unknown[0]]}'?")
    named = ", ".join(key if matches[key] is None else f"{key} (did you mean '{matches[key]}'?)" for key in unknown)
    valid = f"; valid keys: {', '.join(SCHEMA)}" if list_valid else ""
    return ConfigError(f"unknown config key(s){where}: {named}{valid}")


FLOWER_TEMPLATE_KEYS: dict[str, str] = {"num-server-rounds": "num-rounds", "fraction-train": "fraction-fit"}
"""Run-config names of Flower's app templates (``flwr new``) that name one of our keys
otherwise; the template's ``fraction-evaluate``, ``local-epochs`` and ``lr`` are ours already."""


def translate_template_keys(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """``run_config`` with Flower's template names (:data:`FLOWER_TEMPLATE_KEYS`) under ours.

    As in :func:`resolve_run_config`, our key counts as set when it differs from its
    default: a template name then has to agree with it, or the run is refused.
    """
    values = dict(run_config)
    for template, ours in FLOWER_TEMPLATE_KEYS.items():
        if template not in values:
            continue
        value = values.pop(template)
        default = SCHEMA[ours].default
        if ours in values and values[ours] != default and values[ours] != value:
            raise ConfigError(
                f"config keys '{template}' = {value!r} and '{ours}' = {values[ours]!r} name the same setting "
                f"with different values; set one of them"
            )
        if ours not in values or values[ours] == default:
            values[ours] = value
    return values


def resolve_run_config(run_config: Mapping[str, Any], *, ignore_unknown: bool = False) -> RunConfig:
    """Merge defaults, the selected preset and explicit overrides, then validate.

    Flower passes the app's defaults already merged with ``--run-config``, so an
    override is recognised as a value that differs from the default; those win
    over the preset, every other key takes the preset's value. Flower's template names
    (``num-server-rounds``, ``fraction-train``) are read as ours. Unknown keys are
    an error (they are usually typos) unless ``ignore_unknown``: a project that
    embeds our strategies or ClientApp may carry keys of its own in the same
    run config, and those are then left out.
    """
    run_config = translate_template_keys(run_config)
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown and ignore_unknown:
        run_config = {name: value for name, value in run_config.items() if name in SCHEMA}
    elif unknown:
        raise unknown_keys_error(unknown, list_valid=True)
    base = defaults()
    preset_name = SCHEMA["preset"].check("preset", run_config.get("preset", ""))
    merged: dict[str, Any] = dict(base)
    if preset_name:
        preset = load_preset(str(preset_name))
        bad = sorted(set(preset) - set(SCHEMA))
        if bad:
            raise unknown_keys_error(bad, where=f" in preset {preset_name!r}")
        merged.update(preset)
    for name, value in run_config.items():
        if name not in base or value != base[name]:
            merged[name] = value
    return validate(merged)


def validate(values: Mapping[str, Any]) -> RunConfig:
    """Check every key, then the rules that tie keys together."""
    unknown = sorted(set(values) - set(SCHEMA))
    if unknown:
        raise unknown_keys_error(unknown)
    config = RunConfig.from_values(
        {name: key.check(name, values.get(name, key.default)) for name, key in SCHEMA.items()}
    )
    for rule in CROSS_RULES:
        rule(config)
    return config
