"""Install profiles: a run that needs a missing extra is refused in one line naming it, at the
entry point the user meets (a node's ClientApp, the ServerApp's strategy, the launcher),
before any data is loaded or any model built."""

from __future__ import annotations

import importlib.util

import pytest
import tomllib
from flwr.app import Message, RecordDict
from flwr.common import Context, MessageType

from fedapp import client_app
from fedapp.catalog import CATALOG, methods_where
from fedapp.client_app import make_client_app
from fedapp.config import resolve_run_config
from fedapp.extras import (
    FLWR_DATASETS,
    OPEN_CLIP,
    SCIKIT_LEARN,
    MissingExtraError,
    client_requirements,
    server_requirements,
)
from fedapp.launch.settings import prepare_run
from fedapp.report import main as report_main
from fedapp.server_app import build_strategy
from tests.paths import ROOT


def hide(monkeypatch, *modules: str) -> None:
    """Make ``modules`` look uninstalled to :func:`importlib.util.find_spec`."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in modules else find_spec(name, *a))


def no_data_loading(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the data was loaded before the extras were checked")

    monkeypatch.setattr(client_app, "load_client_data", refuse)


def extras_declared() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_extra_named_by_a_requirement_is_declared_and_installs_its_package():
    declared = extras_declared()
    for requirement in (OPEN_CLIP, SCIKIT_LEARN, FLWR_DATASETS):
        assert any(spec.startswith(requirement.distribution) for spec in declared[requirement.extra]), requirement


def test_the_base_install_has_no_optional_package():
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {spec.split("=")[0].split(">")[0].split("[")[0] for spec in base}
    # click only as a cap on the version Flower brings (its CLI needs typer < 0.21, which click 9 breaks);
    # tomli-w, which Flower brings too, because fedapp.options writes TOML values with it in every process
    names_expected = {"flwr", "click", "torch", "torchvision", "numpy", "pyyaml", "pillow", "safetensors", "tomli-w"}
    assert names == names_expected
    assert not any("[" in spec for spec in base)  # flwr without [simulation]: no Ray on a device


@pytest.mark.parametrize("method", methods_where(backbone="cnn") + methods_where(backbone="cnn+server-clip"))
def test_cnn_and_fedd2p_clients_on_their_own_data_need_nothing_beyond_the_base(method, tmp_path):
    config = resolve_run_config({"method": method, "dataset": "imagefolder", "data-dir": str(tmp_path)})
    assert client_requirements(config, own_data_dir=True) == []


@pytest.mark.parametrize("method", methods_where(backbone="clip-text") + methods_where(backbone="clip-vision"))
def test_clip_and_vit_clients_need_the_clip_extra(method, tmp_path):
    config = resolve_run_config(
        {"method": method, "dataset": "imagefolder", "data-dir": str(tmp_path), "class-prompt-layers": "2"}
    )  # the tiny CLIP's one block
    needs = client_requirements(config, own_data_dir=True)
    assert [requirement for requirement, _ in needs] == [OPEN_CLIP]


def test_a_client_partitioning_the_shared_digits_needs_the_data_extra():
    needs = client_requirements(resolve_run_config({"method": "fedavg"}), own_data_dir=False)
    assert [requirement for requirement, _ in needs] == [SCIKIT_LEARN, FLWR_DATASETS]
    # digits comes from scikit-learn whatever the node's data-dir; only the partitioner is spared
    needs = client_requirements(resolve_run_config({"method": "fedavg"}), own_data_dir=True)
    assert [requirement for requirement, _ in needs] == [SCIKIT_LEARN]


def test_the_server_of_a_clip_method_needs_clip_and_plots():
    needs = [r.extra for r, _ in server_requirements(resolve_run_config({"method": "fedd2p"}))]
    assert "clip" in needs and "server" in needs
    assert CATALOG["fedd2p"].backbone == "cnn+server-clip"


def clip_message(tmp_path) -> tuple[Message, Context]:
    context = Context(run_id=1, node_id=7, node_config={"data-dir": str(tmp_path)}, state=RecordDict(), run_config={})
    return Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN), context


def test_a_lean_node_refuses_a_clip_method_in_one_line_before_loading_data(tmp_path, monkeypatch, task_identity):
    hide(monkeypatch, "open_clip")
    no_data_loading(monkeypatch)
    message, context = clip_message(tmp_path)
    with pytest.raises(MissingExtraError) as info:
        make_client_app({"method": "sdfed", "dataset": "imagefolder", "data-dir": str(tmp_path)})(message, context)
    assert str(info.value) == (
        "method 'sdfed' (a CLIP text-prompt client) needs open_clip_torch, which this install lacks: "
        "pip install 'fedapp[clip]' (or -e '.[clip]' in a checkout)"
    )


def test_a_lean_node_partitioning_digits_is_told_to_install_the_data_extra(monkeypatch, task_identity):
    hide(monkeypatch, "sklearn")
    no_data_loading(monkeypatch)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    message = Message(RecordDict(), dst_node_id=7, message_type=MessageType.TRAIN)
    with pytest.raises(MissingExtraError, match=r"^dataset 'digits' needs scikit-learn, .*fedapp\[data\]"):
        make_client_app({"method": "fedavg"})(message, context)


def test_a_server_without_plots_is_refused_before_the_results_folder(tmp_path, monkeypatch):
    hide(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtraError, match=r"^the run's plots needs matplotlib, .*fedapp\[server\]"):
        build_strategy(resolve_run_config({"results-dir": str(tmp_path)}))
    assert not any(tmp_path.iterdir())


def test_the_launcher_without_ray_names_the_simulation_extra(monkeypatch):
    hide(monkeypatch, "ray")
    with pytest.raises(MissingExtraError, match=r"^a local simulation needs ray, .*fedapp\[simulation\]"):
        prepare_run({})


def test_the_report_without_matplotlib_says_how_to_skip_the_figure_and_writes_nothing(tmp_path, monkeypatch, capsys):
    hide(monkeypatch, "matplotlib")
    out = tmp_path / "report.md"
    assert report_main([str(tmp_path), "--out", str(out)]) == 2
    assert 'fedapp-report\'s figure (--figure "" skips it) needs matplotlib' in capsys.readouterr().err
    assert not out.exists()
