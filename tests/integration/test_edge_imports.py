"""What an edge device imports: a FedD2P client trains and evaluates in a fresh process without
open_clip, and training imports no ``torch._dynamo`` (a deployed ClientApp is a new process per message,
so every import is paid per message)."""

from __future__ import annotations

import subprocess
import sys

from tests.paths import ROOT


def test_an_edge_client_imports_neither_open_clip_nor_dynamo(tmp_path):
    script = (
        "import sys, torch\n"
        "from clients.fedd2p import FedD2PClient\n"
        "from fedapp.clientdata import load_client_data\n"
        "from fedapp.config import resolve_run_config\n"
        "from fedapp.state import MemoryStateStore\n"
        "import numpy as np\n"
        "c = resolve_run_config({'method': 'fedd2p', 'client-models': 'vgg-2', 'num-partitions': 4})\n"
        "client = FedD2PClient(c, load_client_data(c, 0, 4), MemoryStateStore({}), torch.device('cpu'))\n"
        "k = [np.full((10, 10), 0.1, np.float32), np.ones(10, np.float32)]\n"
        "client.fit(k, {'server-round': 1}); client.evaluate(k, {})\n"
        "assert 'open_clip' not in sys.modules, 'open_clip was imported'\n"
        "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
