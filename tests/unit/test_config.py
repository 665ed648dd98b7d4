"""Configuration: schema defaults, presets, overrides and every bad-config message."""

from __future__ import annotations

import re

import pytest
import tomllib

from fedapp.catalog import CATALOG
from fedapp.config import (
    APP_ROOT,
    SCHEMA,
    RunConfig,
    defaults,
    find_preset,
    resolve_run_config,
    settings_digest,
    validate,
)
from fedapp.config.schema import COMMON_KEYS
from fedapp.errors import ConfigError
from fedapp.registry import client_class, strategy_class
from tests.paths import ROOT


def test_pyproject_declares_exactly_the_schema_defaults():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == defaults()


def test_the_catalog_names_every_method_and_each_lives_under_its_own_name():
    assert tuple(CATALOG) == SCHEMA["method"].choices
    servers = {spec.module for spec in CATALOG.values()}
    for name, spec in CATALOG.items():
        assert strategy_class(name).__module__ == spec.strategy.partition(":")[0]
        assert client_class(name).__module__ == spec.client.partition(":")[0]
        if spec.variant_of:  # the same two halves as the method it varies, with other settings
            parent = CATALOG[spec.variant_of]
            assert (spec.strategy, spec.client) == (parent.strategy, parent.client), name
            continue
        assert spec.client == f"fedapp.clients.{spec.module}:{spec.client.partition(':')[2]}", name
        # a strategy of its own, or the server of another catalogued method (nothing-shared ones reuse Standalone)
        assert spec.strategy.partition(":")[0].removeprefix("fedapp.strategies.") in servers, name
        # every method with math of its own keeps it in fedapp/methods/<module>.py; these only average a
        # shared module (the zoo CNN, a head, one text context, visual prompts) or share nothing
        math_free = ("fedavg", "lg-fedavg", "promptfl", "head-fedavg", "fedvpt")
        has_math = (ROOT / "fedapp" / "methods" / f"{spec.module}.py").exists()
        assert has_math != (name in math_free or spec.uploads == "nothing"), name


def test_defaults_validate_and_name_the_run():
    config = resolve_run_config(defaults())
    assert config["method"] == "fedavg"
    assert re.fullmatch(r"fedavg-digits-dirichlet-[0-9a-f]{6}-s0", config.resolved_run_name)


def test_derived_run_names_differ_with_any_setting_but_resume_keeps_the_name():
    def name(**values):
        return resolve_run_config(values).resolved_run_name

    base = name()
    assert name(lr=0.02) != base and name(**{"num-rounds": 3}) != base
    assert name(seed=1) == base.replace("-s0", "-s1")  # seeds of one setting share the digest
    assert name(resume=True) == base and name(**{"results-dir": "elsewhere"}) == base
    # Only non-default values count: a key at its default (as a key added later would be) leaves the name.
    assert name(aggregation="mean") == base and name(aggregation="median") != base
    assert settings_digest({"lr": 0.01}) == settings_digest({"lr": 0.01, "aggregation": "mean"})


def test_preset_applies_and_explicit_override_wins(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("method: standalone\nnum-rounds: 3\nalpha: 0.5\n")
    run_config = {**defaults(), "preset": str(preset), "num-rounds": 7}
    config = resolve_run_config(run_config)
    assert config["method"] == "standalone"  # from the preset
    assert config["alpha"] == 0.5
    assert config["num-rounds"] == 7  # explicit override beats the preset


def test_shipped_presets_all_validate(tmp_path):
    presets = sorted((ROOT / "conf").glob("*.yaml"))
    assert presets, "conf/ ships presets"
    for preset in presets:
        # Presets for local image folders leave data-dir to the user.
        config = resolve_run_config({"preset": f"conf/{preset.name}", "data-dir": str(tmp_path)})
        assert config["preset"] == f"conf/{preset.name}"


def test_relative_presets_resolve_against_the_app_root_from_any_working_directory(tmp_path, monkeypatch):
    assert APP_ROOT == ROOT and (APP_ROOT / "pyproject.toml").is_file()
    monkeypatch.chdir(tmp_path)  # no conf/ here: the app root is where it is found
    assert find_preset("conf/fedavg-digits.yaml") == APP_ROOT / "conf" / "fedavg-digits.yaml"
    config = resolve_run_config({"preset": "conf/fedavg-digits.yaml", "num-rounds": 3})
    assert (config.preset, config.method, config.num_rounds) == ("conf/fedavg-digits.yaml", "fedavg", 3)


def test_int_is_accepted_for_a_float_key():
    assert validate({"alpha": 1})["alpha"] == 1.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"no-such-key": 1}, "unknown config key(s): no-such-key"),
        ({"num-rounds": "ten"}, "'num-rounds' = 'ten' has type str, expected int"),
        ({"num-rounds": 2.5}, "'num-rounds' = 2.5 has type float, expected int"),
        ({"lr": True}, "'lr' = True has type bool, expected float"),
        ({"alpha": 0.0}, "'alpha' = 0.0 must be > 0.0"),
        ({"alpha": -1.0}, "'alpha' = -1.0 must be > 0.0"),
        ({"fraction-fit": 0.0}, "'fraction-fit' = 0.0 must be > 0.0"),
        ({"fraction-fit": 1.5}, "'fraction-fit' = 1.5 must be <= 1.0"),
        ({"num-rounds": 0}, "'num-rounds' = 0 must be >= 1"),
        ({"lr": float("nan")}, "'lr' = nan must be a finite number"),
        ({"method": "fedsgd"}, "'method' = 'fedsgd' is not one of"),
        ({"dataset": "mnist"}, "'dataset' = 'mnist' is not one of"),
        ({"partition": "zipf"}, "'partition' = 'zipf' is not one of"),
        ({"model": "resnet-999"}, "'model' = 'resnet-999' is not one of"),
        ({"partition": "pathological", "classes-per-client": 11}, "'classes-per-client' = 11 is more than the 10"),
        ({"dataset": "imagefolder"}, "'data-dir' is empty"),
        (
            {"dataset": "imagefolder", "data-dir": "/no/such/folder"},
            "'data-dir' = '/no/such/folder': path does not exist",
        ),
        ({"test-data-dir": "/no/such/test"}, "'test-data-dir' is set, but dataset 'digits'"),
        ({"dataset": "hf"}, "'hf-name' is empty"),
        ({"min-clients": 11}, "'min-clients' = 11 is more than 'num-partitions' = 10"),
        ({"preset": "conf/missing.yaml"}, "'preset' = 'conf/missing.yaml': file not found"),
    ],
)
def test_bad_config_gives_a_message_naming_key_and_value(override, message):
    with pytest.raises(ConfigError) as info:
        resolve_run_config({**defaults(), **override})
    assert message in str(info.value)


def test_unknown_keys_of_an_embedding_project_can_be_left_out():
    theirs = {"method": "pfedlora", "num-rounds": 4, "their-learning-rate": 0.5}
    with pytest.raises(ConfigError, match="unknown config key"):
        resolve_run_config(theirs)
    config = resolve_run_config(theirs, ignore_unknown=True)
    assert config["method"] == "pfedlora" and config["num-rounds"] == 4
    assert "their-learning-rate" not in config.as_dict()
    with pytest.raises(ConfigError, match="num-rounds"):  # our own keys are still checked
        resolve_run_config({**theirs, "num-rounds": -1}, ignore_unknown=True)


def test_preset_with_unknown_key_is_refused(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("method: fedavg\nrounds: 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'rounds' in preset .*bad\.yaml'"):
        resolve_run_config({"preset": str(preset)})


def test_preset_that_is_not_a_mapping_is_refused(tmp_path):
    preset = tmp_path / "list.yaml"
    preset.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        resolve_run_config({"preset": str(preset)})


def test_a_client_validates_its_run_config_once_per_process_not_per_message(monkeypatch):
    from fedapp import client_app  # noqa: PLC0415 - patched for this test only

    calls = []
    real = client_app.resolve_run_config

    def counting(values, ignore_unknown=False):
        calls.append(values)
        return real(values, ignore_unknown=ignore_unknown)

    monkeypatch.setattr(client_app, "resolve_run_config", counting)
    client_app._resolved_config.cache_clear()
    values = {**defaults(), "method": "sdfed", "num-partitions": 1000, "local-prompt-lengths": "random:4-16"}
    first = client_app.resolved_config(values, False)
    for _ in range(5):
        assert client_app.resolved_config(dict(values), False) is first
    assert len(calls) == 1
    other = client_app.resolved_config({**values, "seed": 1}, False)
    assert other["seed"] == 1 and len(calls) == 2
    client_app._resolved_config.cache_clear()


def test_prompt_length_rule_reads_each_models_context_once(monkeypatch):
    import fedapp.models.clip as clip_module  # noqa: PLC0415 - patched for this test only

    asked = []
    real = clip_module.text_context_length
    monkeypatch.setattr(clip_module, "text_context_length", lambda model: asked.append(model) or real(model))
    resolve_run_config({"method": "sdfed", "num-partitions": 1000, "local-prompt-lengths": "random:4-16"})
    assert asked == ["fedapp-tiny-clip"]  # not once per client


def test_every_key_is_a_typed_attribute_of_the_run_config_or_of_its_method_s_options():
    config = resolve_run_config({"num-rounds": 4, "lr": 1, "model": "cnn-2"})
    for key, spec in COMMON_KEYS.items():
        value = getattr(config, key.replace("-", "_"))
        assert type(value) is spec.type, key
        assert config[key] == value
    for method, spec in CATALOG.items():
        options = RunConfig.from_values({**defaults(), "method": method}).options
        assert type(options) is spec.options
        for key in spec.keys:
            assert type(getattr(options, key.replace("-", "_"))) is SCHEMA[key].type, (method, key)
            assert config[key] == getattr(options, key.replace("-", "_"))  # every method's key, by name
    assert (config.num_rounds, config.lr, config.model) == (4, 1.0, "cnn-2")
    with pytest.raises(KeyError):
        config["num_rounds"]  # config names are hyphenated; attributes underscored
