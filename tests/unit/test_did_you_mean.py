"""A misspelt key, method or choice is refused with the name it likely meant ("did you mean ...?")."""

from __future__ import annotations

import runpy
import sys

import pytest

from fedapp.config import SCHEMA, defaults, resolve_run_config, validate
from fedapp.errors import ConfigError
from fedapp.options import close_match, did_you_mean
from fedapp.registry import method_spec


def refusal(overrides: dict) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_run_config({**defaults(), **overrides})
    return str(info.value)


def test_close_match_finds_typos_ignores_case_and_leaves_distinct_names_alone():
    assert close_match("num-round", SCHEMA) == "num-rounds"
    assert close_match("FedAvg", ("fedavg", "fedprox")) == "fedavg"
    assert close_match("pfed-lora", ("fedavg", "pfedlora")) == "pfedlora"
    # Another algorithm that only shares letters with one of ours is not a typo of it.
    assert close_match("fedsgd", ("fedavg", "fedkd", "fedd2p")) is None
    assert did_you_mean("cifar-10", ("cifar10", "cifar100")) == ": did you mean 'cifar10'?"
    assert did_you_mean("zipf", ("iid", "dirichlet")) == ""


def test_one_misspelt_key_is_refused_with_the_key_it_likely_meant():
    assert refusal({"num-round": 3}) == "unknown config key 'num-round': did you mean 'num-rounds'?"


def test_several_unknown_keys_are_listed_each_with_its_close_match():
    message = refusal({"lrr": 0.1, "no-such-key": 1})
    assert message.startswith("unknown config key(s): lrr (did you mean 'lr'?), no-such-key; valid keys: ")
    assert message.endswith(", ".join(SCHEMA))


def test_an_unknown_key_without_a_close_match_lists_the_valid_keys():
    assert refusal({"no-such-key": 1}) == f"unknown config key(s): no-such-key; valid keys: {', '.join(SCHEMA)}"


def test_a_misspelt_key_in_a_preset_names_the_preset_and_the_key_it_likely_meant(tmp_path):
    preset = tmp_path / "typo.yaml"
    preset.write_text("method: fedavg\nlocal-epoch: 2\n")
    with pytest.raises(ConfigError) as info:
        resolve_run_config({"preset": str(preset)})
    assert str(info.value) == f"unknown config key 'local-epoch' in preset '{preset}': did you mean 'local-epochs'?"


@pytest.mark.parametrize(
    ("key", "value", "meant"),
    [
        ("method", "pfedlor", "pfedlora"),
        ("method", "FedAvg", "fedavg"),
        ("dataset", "cifar-10", "cifar10"),
        ("partition", "dirichelt", "dirichlet"),
        ("tracker", "tensorbord", "tensorboard"),
        ("aggregation", "mediann", "median"),
        ("model", "cnn5", "cnn-5"),
    ],
)
def test_a_misspelt_choice_is_refused_with_the_choice_it_likely_meant(key, value, meant):
    message = refusal({key: value})
    assert message.startswith(f"config key '{key}' = '{value}' is not one of: ")
    assert message.endswith(f": did you mean '{meant}'?")
    listed = message.split(" is not one of: ", 1)[1].rsplit(": did you mean ", 1)[0].split(", ")
    assert meant in listed and len(listed) > 1  # the full list is still given


def test_a_choice_without_a_close_match_gets_no_guess():
    assert not refusal({"partition": "zipf"}).endswith("?")
    assert not refusal({"method": "fedsgd"}).endswith("?")


def test_a_misspelt_client_model_is_refused_with_the_model_it_likely_meant():
    message = refusal({"method": "fedkd", "client-models": "cnn-1,cnn5"})
    assert "names 'cnn5', not one of: " in message and message.endswith(": did you mean 'cnn-5'?")


def test_the_method_registry_suggests_the_method_it_likely_meant():
    with pytest.raises(ConfigError, match=r"'method' = 'pfedlor' is not one of: .*: did you mean 'pfedlora'\?$"):
        method_spec("pfedlor")
    assert validate({"method": "pfedlora"}).method == method_spec("pfedlora").name


def test_the_launcher_refuses_a_misspelt_key_in_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """``python -m fedapp.launch --run-config 'num-round=3'``: exit 2, the line with its suggestion, nothing made."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    monkeypatch.setattr(sys, "argv", ["fedapp.launch", "--run-config", "num-round=3", "--flwr-home", str(home)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("fedapp.launch", run_name="__main__")
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["error: unknown config key 'num-round': did you mean 'num-rounds'?"]
    assert list(tmp_path.iterdir()) == []
