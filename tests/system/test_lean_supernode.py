"""The lean install on a device: a venv with only the base profile (no Ray, open_clip,
scikit-learn, flwr-datasets, matplotlib) serves every edge client (FedAvg/Standalone,
pFedLoRA and its baselines, FedD2P's edge client) on its own ImageFolder data.

- Every edge method runs two rounds with its clients in a lean process (our ClientApp's
  ``client_fn``, one client per message, each node's context kept between them) and its
  strategy here, with the full install, exchanging Flower's own instruction and reply
  objects over a pipe (``benchmarks/edge.py``'s worker): seconds per method.
- Over real processes, lean SuperNodes against a full-install SuperLink: FedD2P two
  rounds, a CLIP method refused by the nodes in one line naming the
  extra, and personal state on disk surviving a SuperNode restart.

The venv gets torch linked from this environment (a device installs its own torch build
first, docs/edge.md), then ``pip install <project>`` with no extras. The lean processes
get no ``PYTHONPATH``: a device's SuperNode has its own environment, not this one's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedapp.catalog import CATALOG, methods_where
from fedapp.config import resolve_run_config
from fedapp.flower.driver import drive_rounds, stand_in_manager
from fedapp.launch import free_port
from fedapp.server_app import build_strategy
from tests.paths import ROOT, load_script
from tests.system.federation import (
    BIN,
    Processes,
    RunQueue,
    connection_toml,
    flower_env,
    healthy,
    run_app,
    run_metrics,
    wait_for,
)

EDGE_METHODS = (*(m for m in methods_where(backbone="cnn") if not CATALOG[m].variant_of), "fedd2p")
"""Every client the lean profile serves: FedAvg/Standalone, pFedLoRA and its baselines, FedD2P's edge client
(FedD2P's two variants run its client unchanged)."""

OVER_SUPERNODES = ("fedd2p",)
"""The edge method that also runs over real lean SuperNodes: FedD2P's IoT client. (pFedLoRA's client runs
from the lean install above, and over real SuperNodes of the full install in test_deployment.py and, as
docs/deployment.md writes it, test_docs_deployment.py: a lean SuperNode adds no method's code to that.)"""

NOT_IN_THE_LEAN_INSTALL = ("ray", "open_clip", "sklearn", "flwr_datasets", "datasets", "matplotlib", "pandas", "mlflow")

IMAGES_PER_NODE = 300

RESTART_RUN = 'method="standalone" state="disk" num-rounds=1 run-name="restart"'


def write_image_folder(folder: Path, indices: range) -> Path:
    """Digits images ``indices`` as an ImageFolder, one folder per class."""
    from sklearn.datasets import load_digits  # noqa: PLC0415 - the test process has the full install

    digits = load_digits()
    for index in indices:
        label = str(int(digits.target[index]))
        pixels = np.rint(digits.images[index] * (255.0 / 16.0)).astype(np.uint8)
        (folder / label).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels, mode="L").save(folder / label / f"{index}.png")
    return folder


@pytest.fixture(scope="module")
def lean_python(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("lean") / "venv"
    try:
        return load_script("lean_env").build_lean_venv(venv, ROOT)
    except subprocess.CalledProcessError as err:
        pytest.fail(f"pip install of the lean profile failed:\n{err.stdout}\n{err.stderr}")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """The server's copy of the digits (it checks the classes) and each device's own half."""
    root = tmp_path_factory.mktemp("lean-images")
    write_image_folder(root / "data-server", range(2 * IMAGES_PER_NODE))
    for node in range(2):
        write_image_folder(root / f"data-{node}", range(node, 2 * IMAGES_PER_NODE, 2))
    return root


def node_config(images: Path, node: int, root: Path) -> dict[str, str | int]:
    """A device's node config: its partition, its own data and the folders it writes to."""
    return {
        "partition-id": node,
        "num-partitions": 2,
        "data-dir": str(images / f"data-{node}"),
        "state-dir": str(root / f"state-{node}"),
        "cache-dir": str(root / f"cache-{node}"),
    }


class LeanFederation:
    """A full-install SuperLink with two SuperNodes from the lean venv."""

    def __init__(self, root: Path, lean_bin: Path, images: Path) -> None:
        self.root = root
        self.images = images
        self.env = flower_env(root / "flwr-home")
        self.node_env = load_script("lean_env").venv_env(lean_bin, self.env)
        self.lean_bin = lean_bin
        self.processes = Processes(root / "logs", self.env)
        # The two nodes work through every run's messages one at a time (a ClientApp process each),
        # so a run's wall time is mostly its wait behind the others': generous timeouts.
        self.queue = RunQueue(lambda config: run_app("lean", config, self.env, timeout=1200))
        self.link_port = free_port()

    def start(self) -> None:
        link = ["--insecure", "--host", "127.0.0.1", "--port", str(self.link_port), "--database", str(self.root / "db")]
        self.processes.start("superlink", [str(BIN / "flower-superlink"), *link])
        wait_for(lambda: healthy(f"http://127.0.0.1:{self.link_port}/health"), "the SuperLink becoming healthy")
        (self.root / "flwr-home" / "config.toml").write_text(connection_toml("lean", f"127.0.0.1:{self.link_port}"))
        for node in range(2):
            self.start_node(node)

    def node_command(self, node: int) -> list[str]:
        config = " ".join(f'{key}="{value}"' for key, value in node_config(self.images, node, self.root).items())
        return [
            str(self.lean_bin / "flower-supernode"),
            *("--insecure", "--superlink", f"127.0.0.1:{self.link_port}", "--port", str(free_port())),
            *("--node-config", config),
        ]

    def start_node(self, node: int) -> subprocess.Popen:
        return self.processes.start(f"supernode-{node}", self.node_command(node), env=self.node_env)

    def submit(self, config: str):
        return self.queue.submit(f'{config} {self.common} results-dir="{self.root / "results"}"')

    @property
    def common(self) -> str:
        """Every run's settings: the devices' own data, with the server's copy of it for the checks."""
        data = self.images / "data-server"
        return f'dataset="imagefolder" data-dir="{data}" num-partitions=2 seed=3 round-timeout=600'

    def close(self) -> None:
        self.queue.drain()
        self.queue.close()
        self.processes.stop_all()


@pytest.fixture(scope="module")
def lean(lean_python, images, tmp_path_factory):
    federation = LeanFederation(tmp_path_factory.mktemp("lean-federation"), lean_python.parent, images)
    try:
        federation.start()
        federation.runs = {
            method: federation.submit(f'method="{method}" num-rounds=2 run-name="{method}"')
            for method in OVER_SUPERNODES
        }
        federation.runs["sdfed"] = federation.submit('method="sdfed" num-rounds=1 run-name="sdfed"')
        federation.runs["restart"] = federation.submit(RESTART_RUN)
        yield federation
    finally:
        federation.close()


def test_the_lean_install_has_none_of_the_extras(lean_python):
    modules = list(NOT_IN_THE_LEAN_INSTALL)
    probe = f"import importlib.util as u; print(' '.join(m for m in {modules} if u.find_spec(m)))"
    # With the environment the lean SuperNodes get, from a folder of the venv's own: a folder in
    # the working directory (Ray's /tmp/ray, say) would pass for an installed namespace package.
    env = load_script("lean_env").venv_env(lean_python.parent)
    probe_command = [str(lean_python), "-c", probe]
    found = subprocess.run(
        probe_command, capture_output=True, text=True, check=True, cwd=lean_python.parent, env=env
    ).stdout.split()
    assert found == []
    imports = [str(lean_python), "-c", "import torch, flwr; print('ok')"]
    done = subprocess.run(imports, capture_output=True, text=True, check=False, env=env)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("method", EDGE_METHODS)
def test_every_edge_client_trains_two_rounds_in_the_lean_install(lean_python, images, tmp_path, method):
    run_config = {
        "method": method,
        "dataset": "imagefolder",
        "data-dir": str(images / "data-server"),
        "num-partitions": 2,
        "num-rounds": 2,
        "seed": 3,
        "results-dir": str(tmp_path),
    }
    clients = load_script("edge").LeanClient(lean_python, method, tmp_path / "clients.log", checkout_code=False)
    try:
        for node in range(2):
            clients.request("context", run_config, node_config(images, node, tmp_path))
        strategy = build_strategy(resolve_run_config(dict(run_config)), record=False)
        drive_rounds(strategy, clients, stand_in_manager(2), 2)
    finally:
        clients.close()
    rows = strategy.history
    assert [r.round for r in rows] == [1, 2]
    assert all(r.clients_fit == 2 and r.clients_failed == 0 and r.clients_evaluated == 2 for r in rows), rows
    assert rows[-1].acc_mean > 0.1  # better than chance on 10 classes


@pytest.mark.parametrize("method", OVER_SUPERNODES)
def test_lean_supernodes_run_two_rounds_on_their_own_data(lean, method):
    rows = run_metrics(lean.root / "results", method, lean.runs[method].result(), lean.processes)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["clients_fit"] == 2 and r["clients_evaluated"] == 2 for r in rows), rows
    assert rows[-1]["acc_mean"] > 0.1  # better than chance on 10 classes


def test_a_clip_method_is_refused_by_a_lean_node_naming_the_extra(lean):
    done = lean.runs["sdfed"].result()
    logs = done.stdout + done.stderr + lean.processes.log("superlink")
    results = lean.root / "results" / "sdfed" / "metrics.jsonl"
    text = logs + (results.read_text() if results.exists() else "")
    assert "needs open_clip_torch, which this install lacks: pip install 'fedapp[clip]'" in text, text[-4000:]


def test_personal_state_on_disk_survives_a_supernode_restart(lean):
    results = lean.root / "results"
    first = run_metrics(results, "restart", lean.runs["restart"].result(), lean.processes)
    assert [r["fit_personal_rounds"] for r in first] == [1.0]
    lean.queue.drain()
    for node in range(2):  # both devices reboot: the processes stop and start again
        lean.processes.stop(f"supernode-{node}")
        lean.start_node(node)
    # The run resumes for a second round: its clients' state is this run's, so they train on from it.
    config = f'{RESTART_RUN.replace("num-rounds=1", "num-rounds=2")} resume=true {lean.common} results-dir="{results}"'
    done = run_app("lean", config, lean.env, timeout=600)
    second = run_metrics(results, "restart", done, lean.processes)
    assert [r["fit_personal_rounds"] for r in second] == [1.0, 2.0]  # round 2 trained on from the saved model
