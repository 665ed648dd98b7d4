"""Our strategies inside a *user's own* ServerApp, written the way a user would, run in Ray simulations.

Each test writes a ServerApp module as source text, imports it from
``tmp_path`` and runs it against this project's ClientApp. Three styles are
covered:

* ``server_fn``: the legacy ``ServerApp(server_fn=...)`` returning our strategy;
* ``workflow``: ``@app.main()`` driving our strategy through Flower's legacy
  ``DefaultWorkflow``;
* ``message``: Flower 1.42's ``flwr new`` Message-API style, ``@app.main()`` calling
  ``MessageStrategy(...).start(grid=..., ...)``, with the template's run-config keys
  (``num-server-rounds``, ``fraction-train``, ``local-epochs``, ``lr``). One of its
  runs answers with the pure Message-API ClientApp (``make_message_client_app``).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import textwrap
from importlib import import_module
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from flwr.serverapp.strategy import Result

from fedapp import strategies
from fedapp.client_app import make_client_app, make_message_client_app
from fedapp.registry import strategy_class
from tests.simulation import simulate

SUPERNODES = 2


# What a user's ServerApp module looks like, in each style. Only the strategy
# class and the run config differ between methods.
SERVER_FN_APP = '''
"""A user's ServerApp (server_fn style) on one of fedapp's strategies."""

from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from fedapp.config import resolve_run_config
from fedapp.strategies import {cls}
from strategies import MyStrategy  # the user's own module of that name

RUN_CONFIG = {run_config!r}
BUILT = []  # the strategies this app built, kept for a look after the run


def server_fn(context: Context) -> ServerAppComponents:
    # The user's own keys ride along in the same run config; ours ignores them.
    config = resolve_run_config({{**context.run_config, **RUN_CONFIG}}, ignore_unknown=True)
    strategy = {cls}.from_config(config)
    BUILT.append(strategy)
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=2))


app = ServerApp(server_fn=server_fn)
'''


WORKFLOW_APP = '''
"""A user's ServerApp (@app.main() style) on one of fedapp's strategies."""

from flwr.common import Context
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.workflow import DefaultWorkflow

from fedapp.config import resolve_run_config
from fedapp.strategies import {cls}
from strategies import MyStrategy  # the user's own module of that name

RUN_CONFIG = {run_config!r}
RUNS = []  # the finished LegacyContexts (strategy and history), kept for a look after the run

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    # The user's own keys ride along in the same run config; ours ignores them.
    config = resolve_run_config({{**context.run_config, **RUN_CONFIG}}, ignore_unknown=True)
    strategy = {cls}.from_config(config)
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=2), strategy=strategy)
    DefaultWorkflow()(grid, legacy)
    RUNS.append(legacy)
'''


MESSAGE_APP = '''
"""A user's ServerApp (Flower 1.42 ``flwr new`` Message-API style) on one of fedapp's strategies."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedapp.config import resolve_run_config
from fedapp.strategies import MessageStrategy, {cls}
from strategies import MyStrategy  # the user's own module of that name

RUN_CONFIG = {run_config!r}
BUILT = []  # the strategies this app built, kept for a look after the run
RESULTS = []  # what each start() returned

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    # The user's own keys (and the template's names for ours) ride along in the same run config.
    config = resolve_run_config({{**context.run_config, **RUN_CONFIG}}, ignore_unknown=True)
    strategy = MessageStrategy({cls}.from_config(config))
    BUILT.append(strategy)
    RESULTS.append(strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=2))
'''

APP_SOURCES = {"server_fn": SERVER_FN_APP, "workflow": WORKFLOW_APP, "message": MESSAGE_APP}


# One method per family, with the cheap settings of the family's own tests.
CASES = {
    "pfedlora": ("PFedLoRAStrategy", {"client-models": "cnn-1,cnn-3"}),
    "sdfed": ("SDFedStrategy", {"local-prompt-lengths": "4,8", "shots-per-class": 8}),
    "fedd2p": ("FedD2PStrategy", {"client-models": "vgg-2,vgg-3", "d2p-steps": 5, "shots-per-class": 10}),
    "pep-fedpt": ("PEPFedPTStrategy", {"clip-model": "fedapp-tiny-vit", "prompt-length": 2, "class-prompt-length": 2}),
}


# A ``flwr new`` project's run config, as its pyproject.toml names the keys (all four
# read as ours; lr differs from our default so that its arrival can be seen).
TEMPLATE_KEYS = {"num-server-rounds": 2, "fraction-train": 1.0, "local-epochs": 1, "lr": 0.01}


def run_config(method: str, style: str = "server_fn") -> dict:
    """The keys both the user's ServerApp and our ClientApp run with (one of them the user's own)."""
    rounds = TEMPLATE_KEYS if style == "message" else {"num-rounds": 2}
    return {
        "my-experiment-tag": "plugin-test",
        "method": method,
        "num-partitions": SUPERNODES,
        **rounds,
        "batch-size": 32,
        "device": "cpu",
        **CASES[method][1],
    }


def user_app(tmp_path: Path, style: str, method: str) -> ModuleType:
    """Write a user's ServerApp module for ``method`` in ``style`` and import it from the user's folder,
    which has a ``strategies.py`` and a ``clients/`` of its own (issue 64: ours are ``fedapp.*``)."""
    (tmp_path / "strategies.py").write_text("class MyStrategy:\n    pass\n")
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "__init__.py").write_text("USER_CLIENTS = []\n")
    source = APP_SOURCES[style].format(cls=CASES[method][0], run_config=run_config(method, style))
    path = tmp_path / f"user_{style}_{method.replace('-', '_')}.py"
    path.write_text(textwrap.dedent(source).lstrip())
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(tmp_path))  # the app's folder leads sys.path, as under `flwr run`
    try:
        spec.loader.exec_module(module)
        # The user's modules answer to the plain names, ours to fedapp.*, both at once.
        assert Path(sys.modules["strategies"].__file__).parent == tmp_path
        assert import_module("clients").__file__ == str(tmp_path / "clients" / "__init__.py")
        # The catalog's lookup, which once reached the user's strategies.py (issue 64's traceback).
        assert strategy_class(method).__module__.startswith("fedapp.strategies.")
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("strategies", "clients"):
            sys.modules.pop(name, None)
    return module


def run_user_app(module: ModuleType, method: str) -> tuple[strategies.FedAppStrategy, object | None]:
    """Run the user's (legacy-style) ServerApp against our ClientApp; return its strategy and Flower's History."""
    simulate(module.app, make_client_app(run_config(method), ignore_unknown=True), num_supernodes=SUPERNODES)
    if hasattr(module, "RUNS"):
        assert len(module.RUNS) == 1, "the user's main() did not finish"
        legacy = module.RUNS[0]
        return legacy.strategy, legacy.history
    assert len(module.BUILT) == 1, "the user's server_fn was not called"
    return module.BUILT[0], None


def check_common(strategy, history, cls_name: str) -> None:
    """Both rounds trained and evaluated both clients through our strategy."""
    assert type(strategy).__name__ == cls_name
    records = strategy.history
    assert [r.round for r in records] == [1, 2]
    for r in records:
        assert r.clients_fit == SUPERNODES and r.clients_failed == 0 and r.clients_evaluated == SUPERNODES
        assert math.isfinite(r.train_loss) and r.train_loss > 0
        assert 0.0 <= r.acc_worst <= r.acc_mean <= 1.0
        assert r.params_round_total > 0
    if history is not None:  # the workflow's own History, filled from our aggregate_* replies
        assert [rnd for rnd, _ in history.losses_distributed] == [1, 2]
        assert all(math.isfinite(loss) and loss > 0 for _, loss in history.losses_distributed)
        assert [rnd for rnd, _ in history.metrics_distributed["acc_mean"]] == [1, 2]
        assert all(0.0 <= acc <= 1.0 for _, acc in history.metrics_distributed["acc_mean"])
        assert [rnd for rnd, _ in history.metrics_distributed_fit["train_loss"]] == [1, 2]


def changed(before: list[np.ndarray], after: list[np.ndarray]) -> bool:
    assert [a.shape for a in before] == [a.shape for a in after]
    return any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def check_method(strategy: strategies.FedAppStrategy, method: str) -> None:
    """The global state moved from round 1's, in the way ``method`` moves it."""
    final = strategy.global_arrays
    # A fresh strategy's initial arrays are what round 1 sent (every initialisation is seeded).
    initial = type(strategy).from_config(strategy.config).initial_arrays()
    assert changed(initial, final), "the global state never moved"
    if method == "fedd2p":
        knowledge, present = final
        assert present.sum() > 0
        # The generator's per-class distributions, not the raw pooled soft labels.
        np.testing.assert_allclose(knowledge[present > 0].sum(axis=1), 1.0, atol=1e-4)
        assert all(math.isfinite(r.extra["generator_loss"]) for r in strategy.history)
        assert "knowledge_model" in vars(strategy)  # the server-held CLIP was built and trained
    elif method == "pep-fedpt":
        prototypes, present = final[-2:]
        assert present.sum() > 0 and np.abs(prototypes[present > 0]).sum() > 0
    elif method == "pfedlora":
        assert all(r.extra.get("eval_adapter_accuracy") is not None for r in strategy.history)
    elif method == "sdfed":
        assert strategy.history[-1].extra["fit_local_prompt_length"] > 0


# Styles alternate across families, so each style runs twice; see the durations
# report for what the full cross product would cost.
@pytest.mark.parametrize(
    ("style", "method"),
    [("server_fn", "pfedlora"), ("workflow", "sdfed"), ("workflow", "fedd2p"), ("server_fn", "pep-fedpt")],
)
def test_strategy_runs_inside_a_user_server_app(tmp_path, style, method):
    module = user_app(tmp_path, style, method)
    strategy, history = run_user_app(module, method)
    check_common(strategy, history, CASES[method][0])
    check_method(strategy, method)


# As the legacy styles, two families each: SDFed answers from the pure Message-API ClientApp
# (handlers only), pFedLoRA from our ClientApp that serves both APIs. (FedD2P and PEP-FedPT run
# inside the legacy styles above; every method's strategy on the Message API is checked against
# its legacy run in test_message_api_runs.py.)
@pytest.mark.parametrize(
    ("method", "client_app_factory"), [("pfedlora", make_client_app), ("sdfed", make_message_client_app)]
)
def test_strategy_runs_inside_a_user_message_api_server_app(tmp_path, method, client_app_factory):
    module = user_app(tmp_path, "message", method)
    config = run_config(method, "message")
    simulate(module.app, client_app_factory(config, ignore_unknown=True), num_supernodes=SUPERNODES)
    assert len(module.RESULTS) == 1, "the user's main() did not finish"
    result, message_strategy = module.RESULTS[0], module.BUILT[0]
    assert isinstance(result, Result)
    strategy = message_strategy.strategy
    # The template's key names reached our config (num-rounds and lr are not our defaults).
    assert (strategy.config.num_rounds, strategy.config.lr, strategy.config.fraction_fit) == (2, 0.01, 1.0)
    check_common(strategy, None, CASES[method][0])
    records = strategy.history
    # Flower's Result holds, per round, what our strategy recorded.
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    for r in records:
        acc = result.evaluate_metrics_clientapp[r.round]["acc_mean"]
        assert isinstance(acc, float) and math.isfinite(acc) and 0.0 <= acc <= 1.0
        assert acc == r.acc_mean
    assert sorted(result.train_metrics_clientapp) == [r.round for r in records if r.clients_fit > 0]
    for rnd, metrics in result.train_metrics_clientapp.items():
        assert metrics["train_loss"] == records[rnd - 1].train_loss
    # The arrays start() returned are the method's final global state.
    returned = result.arrays.to_numpy_ndarrays()
    assert not changed(strategy.global_arrays, returned)
    check_method(strategy, method)
