"""Our strategies inside a *user's own* ServerApp, written the way a user would.

Each simulation test writes a ServerApp module as source text, imports it from
``tmp_path`` and runs it against this project's ClientApp. Two styles are
covered: the legacy ``ServerApp(server_fn=...)`` and the ``@app.main()`` style
that drives a strategy through Flower's ``DefaultWorkflow``.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest
from flwr.server.strategy import Strategy
from flwr.serverapp.strategy import Strategy as MessageApiStrategy

from fedapp import strategies
from fedapp.config import METHODS, resolve_run_config
from fedapp.errors import ConfigError
from fedapp.registry import strategy_class


def test_every_exported_strategy_is_a_flower_strategy():
    assert strategies.__all__ == sorted(strategies.__all__)
    exported = {name: getattr(strategies, name) for name in strategies.__all__}
    classes = {name: obj for name, obj in exported.items() if inspect.isclass(obj) and name.endswith("Strategy")}
    assert set(exported) - set(classes) == {"ClientUpdate"}
    for name, cls in classes.items():
        # MessageStrategy is the Message API's kind of strategy (it drives any of the others).
        assert issubclass(cls, MessageApiStrategy if name == "MessageStrategy" else Strategy), name
    # Every module of the package contributes its strategy classes to __all__.
    package = Path(strategies.__file__).parent
    for path in sorted(package.glob("*.py")):
        module = importlib.import_module(f"fedapp.strategies.{path.stem}")
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, Strategy) and obj.__module__ == module.__name__:
                assert classes.get(name) is obj, f"{module.__name__}.{name} is not exported"


@pytest.mark.parametrize("method", METHODS)
def test_every_registered_method_maps_to_an_exported_strategy(method):
    cls = strategy_class(method)
    assert getattr(strategies, cls.__name__) is cls and cls.__name__ in strategies.__all__


def test_from_config_reads_classes_from_the_data_and_refuses_another_method():
    config = resolve_run_config({"method": "pfedlora", "num-partitions": 2})
    strategy = strategies.PFedLoRAStrategy.from_config(config)
    assert strategy.num_classes == 10 and strategy.class_names == tuple(map(str, range(10)))
    assert strategy.recorder is None and strategy.global_arrays == []
    with pytest.raises(ConfigError, match="served by PFedLoRAStrategy, not FedAvgStrategy"):
        strategies.FedAvgStrategy.from_config(config)
