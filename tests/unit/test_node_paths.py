"""A node's paths are the node's: what a SuperNode writes never goes where a run config says."""

from __future__ import annotations

from pathlib import Path

from fedapp.client_app import node_view
from fedapp.config import resolve_run_config

ESCAPES = {"state-dir": "/tmp/submitted-state", "cache-dir": "/tmp/submitted-cache"}


def test_a_supernode_writes_under_its_node_config(tmp_path):
    config = resolve_run_config({**ESCAPES, "state": "disk"})
    node = {"state-dir": str(tmp_path / "state"), "cache-dir": str(tmp_path / "cache")}
    view = node_view(config, node, supernode=True)
    assert view["state-dir"] == node["state-dir"]
    assert view["cache-dir"] == str((tmp_path / "cache").resolve())
    # The run name stays the server's (a derived name must not change with the node's paths).
    assert view.resolved_run_name == config.resolved_run_name


def test_a_supernode_without_node_paths_uses_the_devices_defaults(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FEDAPP_CACHE_DIR", str(tmp_path / "device-cache"))
    view = node_view(resolve_run_config(dict(ESCAPES)), {}, supernode=True)
    assert view["state-dir"] == str(tmp_path / "xdg" / "fedapp")
    assert view["cache-dir"] == str(tmp_path / "device-cache")
    assert "not used on this SuperNode" in caplog.text and "/tmp/submitted-state" in caplog.text


def test_a_supernode_downloads_into_its_own_cache(tmp_path):
    config = resolve_run_config({"dataset": "cifar10", "download": True, "data-dir": "/tmp/submitted-data"})
    view = node_view(config, {"cache-dir": str(tmp_path)}, supernode=True)
    assert Path(view["data-dir"]) == tmp_path.resolve() / "downloads"


def test_without_downloads_a_supernode_reads_the_run_configs_source(tmp_path):
    config = resolve_run_config({"dataset": "imagefolder", "data-dir": str(tmp_path)})
    assert node_view(config, {}, supernode=True)["data-dir"] == str(tmp_path)


def test_in_a_simulation_the_run_config_decides(tmp_path):
    config = resolve_run_config(dict(ESCAPES))
    view = node_view(config, {"partition-id": 0, "num-partitions": 2}, supernode=False)
    assert view["state-dir"] == ESCAPES["state-dir"] and view["cache-dir"] == ESCAPES["cache-dir"]
    assert view.resolved_run_name == config.resolved_run_name
