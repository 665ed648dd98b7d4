"""Scale: a thousand simulated clients with personal state, a share of them per round.

For pFedLoRA (each client keeps its own CNN) and SDFed (each client keeps its
own local prompt) it runs ``flwr run`` simulations through :mod:`fedapp.launch`
for several (clients, fraction) settings and prints, per run: seconds per round
(the first round apart, it also starts the workers and asks every node its
partition), the wall time, and the peak memory of the whole run.

Memory is the sum of the proportional set size (PSS, shared pages split among
the processes sharing them) of every process of the run: this script, the
``flwr`` CLI, the SuperLink, the simulation process (the ServerApp and every
node's personal state when ``state = "memory"``) and the Ray workers, sampled
twice a second from ``/proc`` (Linux). The machine-wide growth of used memory
(``MemTotal - MemAvailable``, which also sees Ray's shared-memory object store)
is printed beside it.

The default settings sample 100 clients a round out of 1,000 and out of 100:
if a round's time follows the sampled clients and not N, the two agree. The
cross-device table of docs/scale.md keeps 100 a round out of 1,000 to 10,000::

    python benchmarks/scale.py --data /data/cifar10-train.tar.gz
    python benchmarks/scale.py --data /data/cifar10-train.tar.gz --methods pfedlora --state disk \
        --settings 1000:0.1,5000:0.02,10000:0.01
    python benchmarks/scale.py --smoke          # 300 clients on digits (CI); no timing is asserted

Every client tests on images drawn from a shared test pool (``reserve-test``: 10% of the source,
which no client trains on, ``len(pool) // N`` images a client, of its own classes): at 10,000 clients
a client holds about 5 images, too few for a test split of its own, and a run in which no client is
tested ends in error (issue 42). The table says how many clients each round tested, with how many
images each, and the last round's accuracy; a run without an accuracy gets no row. The smoke mode
holds as few images a client (300 clients of digits), so a change that leaves such clients untested
fails there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import data_overrides, markdown_table

from fedapp.launch import run, superlink_pids

GB = 1024**3
METHODS: dict[str, dict[str, Any]] = {
    # Client k runs CNN-(k mod 5 + 1) and keeps it between rounds; only the adapter travels.
    "pfedlora": {"client-models": "cnn-1,cnn-2,cnn-3,cnn-4,cnn-5"},
    # Each client keeps its own variable-length local prompt; the global prompt travels.
    "sdfed": {"shots-per-class": 16},
}
SMOKE_SETTINGS = "300:0.03"
"""About 5 images a client, as at 10,000 clients of CIFAR-10; 9 clients a round."""
TEST_POOL = 0.1
"""``reserve-test``: the share of the source every client draws its test images from."""


@dataclass(frozen=True)
class Setting:
    clients: int
    fraction: float

    @property
    def sampled(self) -> int:
        return max(1, round(self.clients * self.fraction))


def parse_settings(text: str) -> list[Setting]:
    """``"1000:0.1,100:1.0"`` -> [Setting(1000, 0.1), Setting(100, 1.0)]."""
    settings = []
    for item in text.split(","):
        clients, _, fraction = item.partition(":")
        try:
            setting = Setting(int(clients), float(fraction or 1.0))
        except ValueError as err:
            raise ValueError(f"setting {item!r} is not CLIENTS:FRACTION ({err})") from err
        if setting.clients < 2 or not 0.0 < setting.fraction <= 1.0:
            raise ValueError(f"setting {item!r}: need at least 2 clients and a fraction in (0, 1]")
        settings.append(setting)
    return settings


# ----- memory of a process tree ------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them."""
    tree = _children()
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(tree.get(pid, []))
    return seen


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def used_bytes() -> int:
    """Machine-wide used memory: MemTotal - MemAvailable."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


class PeakMemory:
    """Samples, in a thread, the PSS of this process tree and of the SuperLink started in
    ``flwr_home`` (the ``flwr`` CLI detaches it), and the machine's used memory."""

    def __init__(self, flwr_home: Path, interval: float = 0.5) -> None:
        self.flwr_home = flwr_home
        self.interval = interval
        self.peak_pss = 0
        self.baseline_used = used_bytes()
        self.peak_used = self.baseline_used
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            pids = descendants([os.getpid(), *superlink_pids(self.flwr_home)])
            self.peak_pss = max(self.peak_pss, sum(pss_bytes(pid) for pid in pids))
            self.peak_processes = max(self.peak_processes, len(pids))
            self.peak_used = max(self.peak_used, used_bytes())
            self._stop.wait(self.interval)

    @property
    def used_growth(self) -> int:
        return self.peak_used - self.baseline_used


@dataclass(frozen=True)
class ScaleRun:
    method: str
    setting: Setting
    state: str
    round_seconds: list[float]
    clients_fit: list[int]
    wall_seconds: float
    peak_pss: int
    used_growth: int
    processes: int
    clients_tested: list[int]
    test_images: float
    """Mean test images of a client (``partition.json``)."""
    final_accuracy: float

    @property
    def steady_seconds(self) -> float:
        later = self.round_seconds[1:] or self.round_seconds
        return sum(later) / len(later)


def run_scale(method: str, setting: Setting, state: str, common: dict[str, Any], scratch: Path) -> ScaleRun:
    """One simulation of ``method`` at ``setting``, measured."""
    name = f"{method}-{setting.clients}-{setting.fraction:g}-{state}"
    overrides = {
        **common,
        **METHODS[method],
        "method": method,
        "num-partitions": setting.clients,
        "fraction-fit": setting.fraction,
        "fraction-evaluate": setting.fraction,
        "state": state,
        "state-dir": str(scratch / "state"),
        "results-dir": str(scratch / "results"),
        "run-name": name,
    }
    home = Path(tempfile.mkdtemp(prefix="fedapp-scale-home-", dir=scratch))
    started = time.perf_counter()
    with PeakMemory(home) as memory:
        run_dir = run(overrides, num_clients=setting.clients, flwr_home=home)
    wall = time.perf_counter() - started
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = metrics[-1].get("acc_mean")
    if final is None or not math.isfinite(final):
        raise RuntimeError(f"{name}: its last round has no accuracy (no client tested): no row is printed for it")
    clients = json.loads((run_dir / "partition.json").read_text())["clients"].values()
    result = ScaleRun(
        method=method,
        setting=setting,
        state=state,
        round_seconds=[m["round_seconds"] for m in metrics],
        clients_fit=[m["clients_fit"] for m in metrics],
        wall_seconds=wall,
        peak_pss=memory.peak_pss,
        used_growth=memory.used_growth,
        processes=memory.peak_processes,
        clients_tested=[m["clients_evaluated"] for m in metrics],
        test_images=sum(c["test"]["samples"] for c in clients) / len(clients),
        final_accuracy=final,
    )
    print(
        f"{name}: {result.steady_seconds:.1f} s/round after round 1, peak {result.peak_pss / GB:.2f} GB",
        flush=True,
    )
    return result


def table(runs: Sequence[ScaleRun]) -> str:
    header = [
        "method",
        "clients N",
        "per round",
        "state",
        "round 1 s",
        "s/round (2+)",
        "clients fit/round",
        "tested/round x images",
        "acc (last)",
        "wall s",
        "peak PSS GB",
        "used +GB",
        "processes",
    ]
    body = [
        [
            r.method,
            f"{r.setting.clients:,}",
            f"{r.setting.fraction:.0%} = {r.setting.sampled}",
            r.state,
            f"{r.round_seconds[0]:.1f}",
            f"{r.steady_seconds:.1f}",
            "/".join(str(c) for c in r.clients_fit),
            f"{'/'.join(str(c) for c in r.clients_tested)} x {r.test_images:.1f}",
            f"{r.final_accuracy:.3f}",
            f"{r.wall_seconds:.0f}",
            f"{r.peak_pss / GB:.2f}",
            f"{r.used_growth / GB:.2f}",
            str(r.processes),
        ]
        for r in runs
    ]
    return markdown_table(header, body)


def main(argv: Sequence[str] | None = None) -> list[ScaleRun]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="ImageFolder folder or .tar.gz (default: digits, too few for 1,000)")
    parser.add_argument("--settings", default="1000:0.1,100:1.0", help="comma list of CLIENTS:FRACTION")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--state", default="memory", choices=("memory", "disk"), help="where personal state lives")
    parser.add_argument("--smoke", action="store_true", help=f"settings {SMOKE_SETTINGS} on digits, 2 rounds")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods: {', '.join(unknown)} (choose from {', '.join(METHODS)})")
    try:
        settings = parse_settings(SMOKE_SETTINGS if args.smoke else args.settings)
    except ValueError as err:
        parser.error(str(err))
    common = {
        **data_overrides(None if args.smoke else args.data, None),
        # Two classes per client always splits; Dirichlet draws fail at 1,000 clients of 50 images.
        "partition": "pathological",
        "classes-per-client": 2,
        "num-rounds": 2 if args.smoke else args.rounds,
        "local-epochs": 1,
        "batch-size": 32,
        # The same training work per client at every N (16 images of each of its 2 classes),
        # so that rounds with the same number of sampled clients are comparable across N.
        "shots-per-class": 16,
        "reserve-test": TEST_POOL,
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedapp-scale-") as scratch:
        for setting in settings:
            for method in methods:
                runs.append(run_scale(method, setting, args.state, common, Path(scratch)))
    print(table(runs))
    return runs


if __name__ == "__main__":
    main()
