"""What an edge device imports: a FedD2P client trains and evaluates in a fresh process without
open_clip, and training imports no ``torch._dynamo`` (a deployed ClientApp is a new process per message,
so every import is paid per message) once the device has counted its model's FLOPs: counting runs
torch's meta kernels, whose first use imports ``torch._dynamo`` (about 0.9 s), so the count of a
device's first message is kept in its cache folder for every later one (fedapp/flops.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.paths import ROOT

SCRIPT = (
    "import sys, torch\n"
    "from fedapp.clients.fedd2p import FedD2PClient\n"
    "from fedapp.clientdata import load_client_data\n"
    "from fedapp.config import resolve_run_config\n"
    "from fedapp.state import MemoryStateStore\n"
    "import numpy as np\n"
    "c = resolve_run_config({'method': 'fedd2p', 'client-models': 'vgg-2', 'num-partitions': 4})\n"
    "client = FedD2PClient(c, load_client_data(c, 0, 4), MemoryStateStore({}), torch.device('cpu'))\n"
    "k = [np.full((10, 10), 0.1, np.float32), np.ones(10, np.float32)]\n"
    "_, _, metrics = client.fit(k, {'server-round': 1}); client.evaluate(k, {})\n"
    "assert metrics['train_flops'] > 0\n"
    "assert 'open_clip' not in sys.modules, 'open_clip was imported'\n"
    "print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo')\n"
)


def test_an_edge_client_imports_neither_open_clip_nor_dynamo_once_its_flops_are_counted(tmp_path):
    env = {**os.environ, "FEDAPP_CACHE_DIR": str(tmp_path / "cache")}

    def message() -> str:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    first, second = message(), message()
    assert first == "dynamo"  # the first message counts (and says what that costs, to be seen if it changes)
    assert second == "no dynamo"
    assert len(list((tmp_path / "cache" / "flops").iterdir())) >= 1


def test_the_client_app_imports_none_of_flowers_server_side():
    """A SuperNode starts a ClientApp process per message: the link state, the server's strategies
    and our own strategy base (about 0.6 s of imports together) stay out of it."""
    script = (
        "import sys, fedapp.client_app\n"
        "server = ['flwr.server.superlink.linkstate', 'flwr.superlink.grid', 'fedapp.flower.strategy',\n"
        "          'fedapp.flower.message_api', 'fedapp.flower.secure_aggregation', 'fedapp.flower.privacy']\n"
        "print(','.join(name for name in server if name in sys.modules) or 'none')\n"
    )
    assert printed_by(script) == "none"


def test_the_launcher_checks_a_cnn_run_s_configuration_without_torch():
    """The launcher's process lives as long as the run: validating a CNN run's configuration (the zoo's
    model names included) imports no torch there (issue 65; the data are checked in a child process)."""
    script = (
        "import sys\n"
        "from fedapp.launch.settings import prepare_run\n"
        "from fedapp.config import validate\n"
        "validate({'method': 'fml', 'model': 'cnn-2', 'client-models': 'cnn-1,cnn-3'})\n"
        "print('torch' if 'torch' in sys.modules else 'no torch')\n"
    )
    assert printed_by(script) == "no torch"


def printed_by(script: str) -> str:
    """What ``script`` prints in a fresh interpreter (which must succeed)."""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()
