"""Flower's template run-config names (``flwr new``) read as ours, conflicts refused, and the
``api`` key's rule (SecAgg+ is Flower's legacy workflow only)."""

from __future__ import annotations

import pytest

from fedapp.config import resolve_run_config
from fedapp.config.schema import SCHEMA
from fedapp.errors import ConfigError


def test_template_names_set_our_keys():
    config = resolve_run_config(
        {"num-server-rounds": 5, "fraction-train": 0.5, "local-epochs": 2, "lr": 0.01, "num-partitions": 4}
    )
    assert (config.num_rounds, config.fraction_fit, config.local_epochs, config.lr) == (5, 0.5, 2, 0.01)


def test_a_template_name_beside_our_default_wins_as_an_override_would():
    # Flower hands over our pyproject defaults merged with the user's keys: num-rounds = its default.
    config = resolve_run_config({"num-rounds": SCHEMA["num-rounds"].default, "num-server-rounds": 7})
    assert config.num_rounds == 7


def test_agreeing_names_are_accepted_and_conflicting_ones_refused():
    assert resolve_run_config({"num-rounds": 9, "num-server-rounds": 9}).num_rounds == 9
    with pytest.raises(ConfigError, match=r"'num-server-rounds' = 4 and 'num-rounds' = 9 .* set one of them"):
        resolve_run_config({"num-rounds": 9, "num-server-rounds": 4})
    with pytest.raises(ConfigError, match=r"'fraction-train' = 0\.3 and 'fraction-fit' = 0\.6"):
        resolve_run_config({"fraction-fit": 0.6, "fraction-train": 0.3, "num-partitions": 4})


def test_template_values_are_checked_like_ours():
    with pytest.raises(ConfigError, match=r"'fraction-fit' = 0\.0 must be > 0\.0"):
        resolve_run_config({"fraction-train": 0.0})


def test_api_selects_legacy_by_default_and_refuses_secagg_on_the_message_api():
    assert resolve_run_config({}).api == "legacy"
    assert resolve_run_config({"api": "message"}).api == "message"
    with pytest.raises(ConfigError, match="'api' = 'messages' is not one of: legacy, message"):
        resolve_run_config({"api": "messages"})
    secagg = {"method": "fedavg", "secagg": True, "num-partitions": 3, "min-clients": 3}
    resolve_run_config(secagg)  # valid on the legacy API
    with pytest.raises(ConfigError, match="SecAgg\\+ only through its legacy workflow"):
        resolve_run_config({**secagg, "api": "message"})
