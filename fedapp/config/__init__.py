"""Run configuration: the schema, YAML presets, validation and the configuration reference.

Every key a run accepts is declared once, as a typed field of
:class:`~fedapp.config.schema.Settings`, with its default and allowed range.
Flower hands both apps the merged ``[tool.flwr.app.config]`` table plus
``--run-config`` overrides; :func:`resolve_run_config` layers the selected YAML
preset under the explicit overrides and validates the result before any data is
touched or any model is built.

The package's parts, each importing only those listed before it:

* :mod:`~fedapp.config.schema`: ``Key``, ``setting``, ``Settings``, ``SCHEMA``, the
  value sets (datasets, partitions ...) and ``defaults``;
* :mod:`~fedapp.config.key_groups`: ``NOT_SETTINGS``, ``PARTITION_KEYS`` (and ``partition_settings``)
  and ``STORAGE_KEYS``;
* :mod:`~fedapp.config.validated`: the type ``RunConfig`` and ``settings_digest``;
* :mod:`~fedapp.config.derived`: values computed from a configuration (models per
  client, held-out partitions, a partition's domain, the local split);
* :mod:`~fedapp.config.aggregation_rules` and :mod:`~fedapp.config.rules`: the
  cross-key rules;
* :mod:`~fedapp.config.run_config`: presets, ``resolve_run_config``, ``validate`` and
  the digests that compare settings;
* :mod:`~fedapp.config.reference`: the Markdown reference in docs/configuration.md
  (``python -m fedapp.config.reference``; not imported here).

Every public name is re-exported here: import from ``fedapp.config``.
"""

from __future__ import annotations

from fedapp.catalog import METHODS
from fedapp.config.aggregation_rules import MODULUS_RANGE, check_dp_config, check_secagg_config
from fedapp.config.derived import (
    client_clip_model_names,
    client_model_names,
    domain_of_partition,
    held_out_partitions,
    parse_local_split,
)
from fedapp.config.key_groups import (
    NOT_SETTINGS,
    PARTITION_KEYS,
    STORAGE_KEYS,
    partition_settings,
    unread_keys_warning,
    unread_method_keys,
)
from fedapp.config.rules import resume_loses_personal_state
from fedapp.config.run_config import (
    UNCOMPARED,
    find_preset,
    load_preset,
    resolve_run_config,
    same_setting_key,
    validate,
    with_defaults,
)
from fedapp.config.schema import (
    APP_ROOT,
    DATASET_CLASSES,
    DATASETS,
    DEVICES,
    MAX_SYNTHETIC_DOMAINS,
    PARTITIONS,
    RESERVE_BACKBONE,
    SCHEMA,
    STATE_BACKENDS,
    Key,
    Scalar,
    Settings,
    defaults,
    setting,
)
from fedapp.config.validated import RunConfig, settings_digest

__all__ = [
    "APP_ROOT",
    "DATASETS",
    "DATASET_CLASSES",
    "DEVICES",
    "MAX_SYNTHETIC_DOMAINS",
    "METHODS",
    "MODULUS_RANGE",
    "NOT_SETTINGS",
    "PARTITIONS",
    "PARTITION_KEYS",
    "RESERVE_BACKBONE",
    "SCHEMA",
    "STATE_BACKENDS",
    "STORAGE_KEYS",
    "UNCOMPARED",
    "Key",
    "RunConfig",
    "Scalar",
    "Settings",
    "check_dp_config",
    "check_secagg_config",
    "client_clip_model_names",
    "client_model_names",
    "defaults",
    "domain_of_partition",
    "find_preset",
    "held_out_partitions",
    "load_preset",
    "parse_local_split",
    "partition_settings",
    "resolve_run_config",
    "resume_loses_personal_state",
    "same_setting_key",
    "setting",
    "settings_digest",
    "unread_keys_warning",
    "unread_method_keys",
    "validate",
    "with_defaults",
]
