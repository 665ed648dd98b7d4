"""What the lean install costs an edge device: disk, start-up, training speed, traffic and memory.

Why this module is long: it is both the benchmark and, run with ``--worker`` in the lean
venv, the ClientApp-like process it measures (which must import nothing but the standard
library before its timed imports, so the two share this one file), and it drives a real
SuperLink and SuperNode pair besides.

For the base install (``pip install .``, no extras: what a SuperNode needs for the CNN
clients and FedD2P's edge clients on the device's own ``data-dir``) it measures:

* **footprint**: installed packages and megabytes of a lean venv against a full one
  (``[all]``), in total and apart from torch and torchvision with their requirements
  (the device's own build of torch: CPU, CUDA or Jetson);
* per edge client (FedAvg with CNN-1..5 and VGG-2..4, and an SDFed CLIP prompt client on
  ``fedapp-tiny-clip``, which needs the ``[clip]`` extra), on the device's own ImageFolder
  data (scikit-learn's digits written as PNGs, one folder per class):

  - **start-up**: a fresh Python of the lean venv importing what Flower's ClientApp process
    imports for this app (``flwr-clientapp``'s module, ``fedapp.client_app:app``, the
    method's client module), median over ``--startup-runs`` processes;
  - **images/s**: one local epoch of the client's ``fit``, on one torch thread;
  - **bytes/round**: the payload the client receives and sends in a training round (our
    ``bytes_round_total`` accounting: the serialized arrays, up + down);
  - **round RSS, in-process**: peak RSS of a lean-venv process that imports, builds the
    client for every message as the ClientApp does, and runs one round (fit + evaluate);
    the instructions come from the method's real strategy in this process;
  - **ClientApp and SuperNode RSS**: a real ``flower-superlink`` (full venv) and a
    ``flower-supernode`` (lean venv, node config ``data-dir``) on loopback run one round
    through ``flwr run``; every 50 ms the script reads from ``/proc`` the RSS of the
    SuperNode with its SuperExec, and the peak (``VmHWM``) of each ClientApp process.

Venvs are built under ``--workdir`` unless given (the lean ones link torch from this
environment; a full one installs ``[all]``, minutes). A reused venv keeps the packages it
was built with; the worker processes run this checkout's code over them (``PYTHONPATH``),
and the SuperNode runs the app that ``flwr run`` sends it::

    python benchmarks/edge.py --full-venv .venv --workdir /tmp/edgebench --json /tmp/edgebench/edge.json
    python benchmarks/edge.py --lean-venv /tmp/edgebench/lean --no-clip --models cnn-1
    python benchmarks/edge.py --smoke         # this interpreter as "lean", CNN-1 in-process, 80 images (tests)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

# Only the standard library at the top: a worker process (``--worker``, in the lean venv)
# runs this file, and its start-up is what is measured.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lean_env import Footprint, build_lean_venv, footprint_of, installed_sizes, profile_requirements, venv_env

ROOT = Path(__file__).resolve().parents[1]
MB = 1e6  # decimal, as the footprint's megabytes
WORKER = "--worker"
ZOO_MODELS = ("cnn-1", "cnn-2", "cnn-3", "cnn-4", "cnn-5", "vgg-2", "vgg-3", "vgg-4")
CLIP_MODEL, CLIP_METHOD = "fedapp-tiny-clip", "sdfed"
RSS_GOAL_MB = 300.0  # a CNN-1 client round
FOOTPRINT_GOAL = 0.2  # lean over full, apart from torch: under a fifth
SAMPLE_SECONDS = 0.05


# ----- the worker: a ClientApp-like process in the lean venv ----------------------------


def _send(stream: BinaryIO, value: Any) -> None:
    pickle.dump(value, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def _peak_rss_bytes() -> int:
    """This process's peak RSS, ``VmHWM``: unlike ``ru_maxrss``, which a child keeps from
    its parent's memory across fork and exec, it starts afresh with the exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(method: str, startup_only: bool) -> None:
    """Import as Flower's ClientApp process does, say so, then answer instructions from stdin.

    Requests (pickled): ``("context", run_config, node_config)`` (a node's context, kept for
    its ``partition-id``, 0 if unset); ``("fit" | "evaluate", ins, partition)``, answered with
    ``(res, seconds, train_images)`` by a client built from that node's context;
    ``("rss",)``; ``("exit",)``.
    """
    started = time.perf_counter()
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, not into the pickles
    # The imports below are the measured start-up, so they happen here, not at the top.
    # torch first, alone, so that what it costs by itself is seen: the floor under every client.
    import torch  # noqa: PLC0415

    torch_seconds, torch_rss = time.perf_counter() - started, _peak_rss_bytes()
    import flwr.supernode.cli.flwr_clientapp  # noqa: F401, PLC0415 - the flwr-clientapp entry point's module

    from fedapp.client_app import make_numpy_client_fn  # noqa: PLC0415 - also builds fedapp.client_app:app
    from fedapp.registry import client_class  # noqa: PLC0415

    client_class(method)  # the method's client module, imported for the first message
    torch.set_num_threads(1)
    ready = {
        "import_seconds": time.perf_counter() - started,
        "rss": _peak_rss_bytes(),
        "torch": {
            "version": torch.__version__,
            "build": f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU",
            "rss_mb": torch_rss / MB,
            "seconds": torch_seconds,
        },
    }
    _send(replies, ready)
    if not startup_only:
        _answer_requests(replies, make_numpy_client_fn(), {"torch": torch_rss, "imports": _peak_rss_bytes()})


def _answer_requests(replies, client_fn, stages: dict[str, int]) -> None:
    """The worker's loop: ``stages`` holds the peak RSS after each step, to show where memory goes."""
    from flwr.app import RecordDict  # noqa: PLC0415
    from flwr.common import Context  # noqa: PLC0415

    requests = sys.stdin.buffer
    contexts: dict[int, Context] = {}
    while True:
        request = pickle.load(requests)
        if request[0] == "context":
            partition = int(request[2].get("partition-id", 0))
            contexts[partition] = Context(
                run_id=1, node_id=partition, node_config=request[2], state=RecordDict(), run_config=request[1]
            )
            _send(replies, "ok")
        elif request[0] in ("fit", "evaluate"):
            numpy_client = client_fn(contexts[request[2]])  # built for every message, as the ClientApp does
            images = len(numpy_client.data.splits["train"])  # the node's data and client, built here
            stages.setdefault("data and client", _peak_rss_bytes())
            client = numpy_client.to_client()
            begun = time.perf_counter()
            res = getattr(client, request[0])(request[1])
            stages[request[0]] = _peak_rss_bytes()
            _send(replies, (res, time.perf_counter() - begun, images))
        elif request[0] == "rss":
            _send(replies, stages)
        else:
            return


# ----- the parent: instructions from the method's strategy, answered by the worker --------


class WorkerFailed(RuntimeError):
    """The worker process died; its log says why."""


class LeanClient:
    """The clients of one method in a fresh process of ``python``: a client pool for ``drive_rounds``
    (each node's context is given first with ``request("context", run_config, node_config)``).

    ``checkout_code``: this checkout's code over the venv's copy (which is as old as the venv);
    without it, the venv's own install, as a device has it.
    """

    def __init__(
        self, python: Path, method: str, log: Path, *, startup_only: bool = False, checkout_code: bool = True
    ) -> None:
        self.log = log
        env = {**venv_env(python.parent), "FLWR_TELEMETRY_ENABLED": "0"}
        if checkout_code:
            env["PYTHONPATH"] = str(ROOT)
        command = [str(python), __file__, WORKER, method, *(["--startup-only"] if startup_only else [])]
        started = time.perf_counter()
        with log.open("a") as err:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
        ready = self._receive()
        self.startup_seconds = time.perf_counter() - started
        self.import_seconds = float(ready["import_seconds"])
        self.startup_rss = int(ready["rss"])
        self.torch = ready["torch"]
        self.fit_seconds = 0.0
        self.train_images = 0

    def _receive(self) -> Any:
        try:
            return pickle.load(self.process.stdout)
        except (EOFError, pickle.UnpicklingError) as err:
            self.process.wait(timeout=30)
            tail = self.log.read_text(errors="replace")[-3000:]
            raise WorkerFailed(f"the worker ended ({self.process.returncode}); {self.log}:\n{tail}") from err

    def request(self, *request: Any) -> Any:
        _send(self.process.stdin, request)
        return self._receive()

    def run(self, kind: str, instructions: list) -> list:
        replies = []
        for node, ins in instructions:
            res, seconds, images = self.request(kind, ins, node.partition)
            if kind == "fit":
                self.fit_seconds, self.train_images = seconds, images
            replies.append((node, res))
        return replies

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                _send(self.process.stdin, ("exit",))
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class ClientRow:
    """One edge client's figures (RSS in decimal MB)."""

    model: str
    method: str
    startup_seconds: float
    startup_samples: list[float]
    import_seconds: float
    images_per_second: float
    train_images: int
    fit_seconds: float
    bytes_round: int
    round_rss_mb: float  # in-process: imports + one fit + one evaluate in one lean process
    startup_rss_mb: float
    rss_stages_mb: dict[str, float]  # in-process: the peak after torch, imports, data and client, fit, evaluate
    torch: TorchBaseline
    accuracy: float
    clientapp_rss_mb: float | None = None  # real SuperNode: peak of its ClientApp processes
    supernode_rss_mb: float | None = None  # real SuperNode: the SuperNode and its SuperExec
    supernode_parts_mb: dict[str, float] = field(default_factory=dict)  # each of them, its own peak
    supernode_bytes_round: int | None = None
    supernode_round_seconds: float | None = None
    supernode_run_seconds: float | None = None
    note: str = ""


def overrides_for(model: str, method: str, data_dir: Path, work: Path) -> dict[str, Any]:
    """The run config of a one-round, one-client run on the device's own ImageFolder."""
    keys: dict[str, Any] = {"method": method}
    if model == CLIP_MODEL:
        keys["clip-model"] = model
    else:
        keys["model"] = model
    return {
        **keys,
        "dataset": "imagefolder",
        "data-dir": str(data_dir),
        "num-partitions": 1,
        "min-clients": 1,
        "num-rounds": 1,
        "local-epochs": 1,
        "seed": 0,
        "cache-dir": str(work / "cache"),
        "state-dir": str(work / "state"),
        "results-dir": str(work / "results"),
        "run-name": f"edge-{model}-{method}",
    }


def measure_in_process(
    python: Path, model: str, method: str, data_dir: Path, work: Path, startup_runs: int
) -> ClientRow:
    """One round of ``model``'s client in a fresh process of ``python``, driven by the real strategy."""
    from fedapp.config import resolve_run_config  # noqa: PLC0415 - the parent's (full) environment only
    from fedapp.flower.driver import drive_rounds, stand_in_manager  # noqa: PLC0415
    from fedapp.server_app import build_strategy  # noqa: PLC0415

    overrides = overrides_for(model, method, data_dir, work)
    log = work / "logs" / f"worker-{model}-{method}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    samples = []
    for _ in range(startup_runs - 1):
        probe = LeanClient(python, method, log, startup_only=True)
        samples.append(probe.startup_seconds)
        probe.close()
    client = LeanClient(python, method, log)
    try:
        samples.append(client.startup_seconds)
        node_config = {"data-dir": str(data_dir), "cache-dir": str(work / "cache"), "state-dir": str(work / "state")}
        client.request("context", overrides, node_config)
        strategy = build_strategy(resolve_run_config(overrides), record=False)
        drive_rounds(strategy, client, stand_in_manager(1), 1)
        stages = client.request("rss")
    finally:
        client.close()
    [record] = strategy.history
    return ClientRow(
        model=model,
        method=method,
        startup_seconds=statistics.median(samples),
        startup_samples=samples,
        import_seconds=client.import_seconds,
        images_per_second=client.train_images / client.fit_seconds,
        train_images=client.train_images,
        fit_seconds=client.fit_seconds,
        bytes_round=int(record.bytes_round_total),
        round_rss_mb=max(stages.values()) / MB,
        startup_rss_mb=client.startup_rss / MB,
        rss_stages_mb={stage: peak / MB for stage, peak in stages.items()},
        torch=TorchBaseline(**client.torch),
        accuracy=float(record.acc_mean),
    )


# ----- a real SuperLink and SuperNode on loopback --------------------------------------


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (from each process's parent in ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, []))
    return found


def memory_kib(pid: int) -> tuple[int, int, str]:
    """``(VmRSS, VmHWM, command line)`` of ``pid`` in KiB; zeros when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return 0, 0, ""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kib = {key: int(fields.get(key, "0 kB").split()[0]) for key in ("VmRSS", "VmHWM")}
    return kib["VmRSS"], kib["VmHWM"], cmdline


class RssSampler(threading.Thread):
    """Every 50 ms: the RSS of the SuperNode and its SuperExec together, and the peak
    (``VmHWM``, so peaks between samples count) of every ClientApp process below them."""

    def __init__(self, supernode_pid: int) -> None:
        super().__init__(daemon=True)
        self.root = supernode_pid
        self.stopped = threading.Event()
        self.supernode_peak_kib = 0
        self.clientapp_peak_kib: dict[int, int] = {}
        self.parts_peak_kib: dict[str, int] = {}  # the SuperNode's own processes, by program

    def run(self) -> None:
        while not self.stopped.is_set():
            supernode = 0
            for pid in descendants(self.root):
                rss, hwm, cmdline = memory_kib(pid)
                if "flwr-clientapp" in cmdline:
                    self.clientapp_peak_kib[pid] = max(self.clientapp_peak_kib.get(pid, 0), hwm, rss)
                elif cmdline:
                    supernode += rss
                    words = cmdline.split()
                    program = next((Path(w).name for w in words[:2] if "flower-" in w), Path(words[0]).name)
                    self.parts_peak_kib[program] = max(self.parts_peak_kib.get(program, 0), rss)
            self.supernode_peak_kib = max(self.supernode_peak_kib, supernode)
            self.stopped.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def _healthy(port: int) -> bool:
    import httpx  # noqa: PLC0415 - the parent's environment

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).is_success
    except httpx.HTTPError:
        return False


def _wait(condition, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.3)


class LoopbackFederation:
    """A SuperLink from ``full_bin`` and one SuperNode from ``lean_bin`` on 127.0.0.1, each
    with its own ``FLWR_HOME``; everything started is stopped by PID on exit."""

    def __init__(self, full_bin: Path, lean_bin: Path, data_dir: Path, work: Path) -> None:
        from fedapp.launch import free_port  # noqa: PLC0415

        self.full_bin, self.lean_bin, self.work = full_bin, lean_bin, work
        self.data_dir = data_dir
        self.link_port, self.node_port = free_port(), free_port()
        self.processes: dict[str, subprocess.Popen] = {}
        base = venv_env(None)
        common = {
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.5",
        }
        path = base.get("PATH", "")
        # Each side starts its SuperExec and app processes from the first folder on PATH.
        self.link_env = {**base, **common, "PATH": f"{full_bin}{os.pathsep}{path}", "FLWR_HOME": str(work / "home")}
        self.node_env = {**base, **common, "PATH": f"{lean_bin}{os.pathsep}{path}", "FLWR_HOME": str(work / "node")}
        for home in ("home", "node", "logs"):
            (work / home).mkdir(parents=True, exist_ok=True)

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        with (self.work / "logs" / f"{name}.log").open("a") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes[name] = process
        return process

    def __enter__(self) -> LoopbackFederation:
        # A rerun in the same work folder starts afresh: no old runs in the SuperLink's database,
        # no old run folders that a new run would refuse to overwrite (or be mistaken for).
        for database in self.work.glob("link.db*"):  # with SQLite's -wal and -shm files
            database.unlink()
        shutil.rmtree(self.work / "results", ignore_errors=True)
        link = [str(self.full_bin / "flower-superlink"), "--insecure", "--host", "127.0.0.1"]
        link += ["--port", str(self.link_port), "--database", str(self.work / "link.db")]
        self._start("superlink", link, self.link_env)
        _wait(lambda: _healthy(self.link_port), "the SuperLink becoming healthy")
        config = f'data-dir="{self.data_dir}" cache-dir="{self.work / "node-cache"}" state-dir="{self.work / "state"}"'
        node = [str(self.lean_bin / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.link_port}"]
        self.supernode = self._start(
            "supernode", [*node, "--port", str(self.node_port), "--node-config", config], self.node_env
        )
        address = f"127.0.0.1:{self.link_port}"
        toml = f'[superlink]\ndefault = "edge"\n\n[superlink.edge]\naddress = "{address}"\ninsecure = true\n'
        (self.work / "home" / "config.toml").write_text(toml)
        return self

    def __exit__(self, *exc) -> None:
        from fedapp.launch import stop_processes  # noqa: PLC0415

        stop_processes([p.pid for p in self.processes.values()])
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)

    def run_round(self, row: ClientRow, data_dir: Path, timeout: float) -> None:
        """One round of ``row``'s client through ``flwr run``; fills the SuperNode columns."""
        from fedapp.metrics import read_metrics  # noqa: PLC0415

        overrides = overrides_for(row.model, row.method, data_dir, self.work)
        overrides["results-dir"] = str(self.work / "results")
        config = " ".join(f"{k}={json.dumps(v)}" for k, v in overrides.items())
        command = [str(self.full_bin / "flwr"), "run", str(ROOT), "edge", "--stream", "--run-config", config]
        sampler = RssSampler(self.supernode.pid)
        sampler.start()
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command, env=self.link_env, capture_output=True, text=True, timeout=timeout, check=False
            )
        finally:
            sampler.stop()
        row.supernode_run_seconds = time.perf_counter() - started
        metrics = self.work / "results" / str(overrides["run-name"]) / "metrics.jsonl"
        if done.returncode != 0 or not metrics.exists():
            output = f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            raise RuntimeError(f"flwr run failed ({done.returncode}): {output}; logs in {self.work / 'logs'}")
        [record] = read_metrics(metrics)
        if not sampler.clientapp_peak_kib:
            raise RuntimeError(f"no ClientApp process was seen below the SuperNode; logs in {self.work / 'logs'}")
        row.clientapp_rss_mb = max(sampler.clientapp_peak_kib.values()) * 1024 / MB
        row.supernode_rss_mb = sampler.supernode_peak_kib * 1024 / MB
        row.supernode_parts_mb = {name: kib * 1024 / MB for name, kib in sampler.parts_peak_kib.items()}
        row.supernode_bytes_round = int(record["bytes_round_total"])
        row.supernode_round_seconds = float(record["round_seconds"])


# ----- data and venvs ------------------------------------------------------------------


def write_digits_folder(root: Path, per_class: int | None = None) -> Path:
    """scikit-learn's digits as 32 px RGB PNGs in ``root/<digit>/`` (``per_class``: at most that
    many per class); kept when already written with the same count."""
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415
    from sklearn.datasets import load_digits  # noqa: PLC0415 - the parent's (full) environment

    marker = root / ".written"
    want = f"digits per_class={per_class}"
    if marker.exists() and marker.read_text() == want:
        return root
    bunch = load_digits()
    gray = np.rint(bunch.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    counts: dict[int, int] = {}
    for index, (pixels, label) in enumerate(zip(gray, bunch.target, strict=True)):
        label = int(label)
        if per_class is not None and counts.get(label, 0) >= per_class:
            continue
        counts[label] = counts.get(label, 0) + 1
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).resize((32, 32), Image.BILINEAR).convert("RGB").save(folder / f"{index:04d}.png")
    marker.write_text(want)
    return root


def venv_python(given: Path | None, built: Path, *, extras: str = "") -> Path:
    """``given``'s Python, or that of a venv built at ``built`` (reused when it is there)."""
    if given is not None:
        return given / "bin" / "python"
    if (built / "bin" / "python").exists():
        return built / "bin" / "python"
    what = f"[{extras}]" if extras else "lean"
    print(f"building the {what} venv in {built} (torch linked from this environment) ...", flush=True)
    return build_lean_venv(built, ROOT, extras=extras)


@dataclass
class Install:
    """One environment's footprint, as measured, with its label."""

    label: str
    python: str
    footprint: Footprint
    largest_apart_from_torch: list[tuple[str, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        f = self.footprint
        return {
            "label": self.label,
            "python": self.python,
            **asdict(f),
            "other_packages": f.other_packages,
            "other_megabytes": f.other_megabytes,
            "largest_apart_from_torch": self.largest_apart_from_torch,
        }


def measure_install(label: str, python: Path, within: tuple[str, ...] = (), alone: tuple[str, ...] = ()) -> Install:
    sizes, torch = installed_sizes(python, within, alone)
    others = sorted(((n, s / MB) for n, s in sizes.items() if n not in torch), key=lambda pair: -pair[1])
    return Install(label, str(python), footprint_of(sizes, torch), others[:5])


@dataclass
class TorchBaseline:
    """What importing torch alone costs a fresh lean Python (the worker imports it first):
    the floor under every client."""

    version: str
    build: str
    rss_mb: float
    seconds: float


# ----- the report ------------------------------------------------------------------------


@dataclass
class Report:
    rows: list[ClientRow]
    installs: list[Install]
    torch: TorchBaseline
    size_ratio: float | None
    count_ratio: float | None
    rss_goal_mb: float | None
    rss_goal_from: str
    notes: list[str]
    flwr_share: tuple[int, float] | None = (
        None  # packages and MB of flwr's closure in the lean install, apart from torch
    )
    load_average: tuple[float, float] = (0.0, 0.0)  # the 1-minute load average at the start and the end

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": [asdict(r) for r in self.rows],
            "installs": [i.as_dict() for i in self.installs],
            "torch": asdict(self.torch),
            "size_ratio_apart_from_torch": self.size_ratio,
            "count_ratio_apart_from_torch": self.count_ratio,
            "cnn1_round_rss_mb": self.rss_goal_mb,
            "cnn1_round_rss_from": self.rss_goal_from,
            "flwr_share_apart_from_torch": self.flwr_share,
            "load_average_start_end": self.load_average,
            "notes": self.notes,
        }


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def client_table(rows: Sequence[ClientRow]) -> str:
    lines = [
        "| model | method | start-up s | images/s (1 thread) | bytes/round | round RSS MB (in-process) "
        "| ClientApp peak RSS MB (SuperNode) | SuperNode RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r.model, r.method, f"{r.startup_seconds:.2f}", f"{r.images_per_second:,.0f}", f"{r.bytes_round:,}"]
        cells += [_mb(r.round_rss_mb), _mb(r.clientapp_rss_mb), _mb(r.supernode_rss_mb)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def footprint_table(installs: Sequence[Install]) -> str:
    lines = [
        "| install | packages | MB | packages apart from torch | MB apart from torch |",
        "|---|---|---|---|---|",
    ]
    for i in installs:
        f = i.footprint
        lines.append(
            f"| {i.label} | {f.packages} | {f.megabytes:,.0f} | {f.other_packages} | {f.other_megabytes:,.0f} |"
        )
    return "\n".join(lines)


def _met(ratio: float) -> str:
    return "met" if ratio < FOOTPRINT_GOAL else "NOT met"


def render(report: Report) -> str:
    out = [client_table(report.rows), ""]
    out.append(footprint_table(report.installs))
    out.append("")
    if report.size_ratio is not None and report.count_ratio is not None:
        out.append(
            f"Lean / full apart from torch: size {report.size_ratio:.2f}, package count {report.count_ratio:.2f}. "
            f"Goal under a fifth of the full install apart from torch: size {_met(report.size_ratio)}, "
            f"package count {_met(report.count_ratio)}."
        )
    else:
        out.append("Lean / full: not measured (smoke: no lean venv, no full one).")
    lean = report.installs[0]
    largest = ", ".join(f"{name} {mb:.0f} MB" for name, mb in lean.largest_apart_from_torch)
    out.append(f"Largest in {lean.label} apart from torch: {largest}.")
    if report.flwr_share is not None:
        packages, megabytes = report.flwr_share
        f = lean.footprint
        out.append(
            f"Of the lean install apart from torch ({f.other_packages} packages, {f.other_megabytes:.0f} MB), "
            f"flwr and what it requires take {packages} packages, {megabytes:.0f} MB."
        )
    torch = report.torch
    out.append(
        f"Floor: a fresh lean Python importing torch {torch.version} ({torch.build} build) and nothing else: "
        f"{torch.rss_mb:.0f} MB RSS, {torch.seconds:.2f} s (the first client's worker, before anything else)."
    )
    for row in report.rows:
        if row.model == "cnn-1":
            stages = ", ".join(f"{stage} {mb:.0f}" for stage, mb in row.rss_stages_mb.items())
            out.append(f"CNN-1 in-process peak RSS (MB) after each step: {stages}.")
        if row.model == "cnn-1" and row.supernode_parts_mb:
            parts = ", ".join(f"{name} {mb:.0f}" for name, mb in row.supernode_parts_mb.items())
            out.append(f"SuperNode RSS (MB) during the CNN-1 round, each process's peak: {parts}.")
    if report.rss_goal_mb is not None:
        verdict = "met" if report.rss_goal_mb < RSS_GOAL_MB else "NOT met"
        out.append(
            f"Goal a CNN-1 client round under {RSS_GOAL_MB:.0f} MB RSS: {report.rss_goal_mb:.0f} MB "
            f"({report.rss_goal_from}; {report.rss_goal_mb - torch.rss_mb:.0f} MB above the torch floor): {verdict}."
        )
    out.extend(report.notes)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> Report:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None, help="venvs, data, logs (default: a temporary folder)")
    parser.add_argument("--lean-venv", type=Path, default=None, help="an existing lean venv (default: build one)")
    parser.add_argument("--clip-venv", type=Path, default=None, help="an existing lean venv with [clip]")
    parser.add_argument("--full-venv", type=Path, default=None, help="an existing venv with [all] or more")
    parser.add_argument("--models", default=",".join(ZOO_MODELS), help="comma list of zoo models (FedAvg clients)")
    parser.add_argument("--method", default="fedavg", help="the zoo models' method (e.g. pfedlora)")
    parser.add_argument("--no-clip", action="store_true", help="leave out the CLIP prompt client")
    parser.add_argument(
        "--supernode-models",
        default=None,
        help="comma list of models also measured on a real SuperNode (default: all; 'none': none)",
    )
    parser.add_argument("--startup-runs", type=int, default=3, help="processes whose start-up is timed (median)")
    parser.add_argument("--per-class", type=int, default=None, help="images per class (default: all of digits)")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="seconds for each flwr run")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--smoke", action="store_true", help="this interpreter as lean, CNN-1 in-process, 80 images")
    args = parser.parse_args(argv)

    temporary = tempfile.TemporaryDirectory(prefix="fedapp-edge-") if args.workdir is None else None
    work = Path(temporary.name) if temporary else args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        report = _measure(args, work)
    finally:
        if temporary is not None:
            temporary.cleanup()
    print(render(report), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.as_dict(), indent=1))
    return report


def measure_installs(lean: Path, clip: Path | None, full: Path | None, work: Path) -> list[Install]:
    """The footprints: lean, lean with [clip], and the full install (``full``: a given venv, in which
    the ``[all]`` profile is counted, and which is also shown whole; else one built with ``[all]``)."""
    installs = [measure_install("lean (`pip install .`)", lean)]
    if clip is not None:
        installs.append(measure_install("lean + clip (`pip install '.[clip]'`)", clip))
    if full is None:
        installs.append(
            measure_install("full (`pip install '.[all]'`)", venv_python(None, work / "full", extras="all"))
        )
        return installs
    python = full / "bin" / "python"
    installs.append(measure_install(f"given venv {full}, whole", python))
    label = f"full (`[all]`, counted in {full}: what `pip install '.[all]'` needs, as installed there)"
    installs.append(measure_install(label, python, profile_requirements(ROOT, "all"), ("fedapp",)))
    return installs


def supernode_rounds(
    rows: list[ClientRow],
    pythons: list[Path],
    chosen: list[str],
    full_bin: Path,
    data_dir: Path,
    work: Path,
    timeout: float,
) -> None:
    """A real round on a SuperNode of each ``chosen`` row's venv (``pythons``, row by row);
    one SuperLink and SuperNode per venv."""
    by_python: dict[Path, list[ClientRow]] = {}
    for row, python in zip(rows, pythons, strict=True):
        if row.model in chosen:
            by_python.setdefault(python, []).append(row)
    for python, venv_rows in by_python.items():
        with LoopbackFederation(
            full_bin, python.parent, data_dir, work / f"loopback-{python.parent.parent.name}"
        ) as fed:
            for row in venv_rows:
                print(f"SuperNode: {row.model} ({row.method}) ...", flush=True)
                fed.run_round(row, data_dir, timeout)
                if row.supernode_bytes_round != row.bytes_round:
                    row.note = f"bytes/round on the SuperNode {row.supernode_bytes_round:,}"


DEFINITIONS = (
    "Start-up: median seconds from starting a lean Python to having imported flwr-clientapp's module, "
    "fedapp.client_app:app and the method's client. images/s: the training images of one local epoch "
    "over the seconds of the client's fit, on 1 torch thread. bytes/round: the serialized arrays down + up "
    "(bytes_round_total). Round RSS (in-process): peak RSS (VmHWM) of one lean process doing the imports, one fit "
    "and one evaluate. ClientApp peak RSS: the largest VmHWM of the ClientApp processes a real SuperNode started "
    "for the round (one per message, default torch threads); SuperNode RSS: flower-supernode and its "
    f"flower-superexec together, sampled every {SAMPLE_SECONDS * 1000:.0f} ms. MB = 10^6 bytes."
)


def flwr_in(python: Path) -> tuple[int, float]:
    """Packages and MB of flwr and what it requires in ``python``'s environment, apart from torch's closure."""
    sizes, torch = installed_sizes(python)
    flwr = set(installed_sizes(python, ("flwr",))[0]) - torch
    return len(flwr), sum(sizes[name] for name in flwr) / MB


def _measure(args: argparse.Namespace, work: Path) -> Report:
    notes: list[str] = []
    load_at_start = os.getloadavg()[0]
    if args.smoke:
        lean, clip, models, chosen, startup_runs, per_class = Path(sys.executable), None, ["cnn-1"], [], 1, 8
        notes.append(
            f"Smoke: the lean figures are this interpreter's environment ({sys.prefix}), not a lean install; "
            "CNN-1 only, in-process, 8 images per class, no CLIP client, no SuperNode."
        )
    else:
        lean = venv_python(args.lean_venv, work / "lean")
        clip = None if args.no_clip else venv_python(args.clip_venv, work / "lean-clip", extras="clip")
        if clip is None:
            notes.append("The CLIP prompt client was left out (--no-clip).")
        models, startup_runs, per_class = args.models.split(","), args.startup_runs, args.per_class
        every = [*models, *([CLIP_MODEL] if clip else [])]
        chosen = (
            every if args.supernode_models is None else [m for m in args.supernode_models.split(",") if m != "none"]
        )
    data_dir = write_digits_folder(work / "data", per_class)

    if args.smoke:
        installs = [measure_install("this environment (smoke: NOT a lean install)", lean)]
        size_ratio = count_ratio = flwr_share = None
    else:
        installs = measure_installs(lean, clip, args.full_venv, work)
        if args.full_venv is not None:
            notes.append(
                f"The full install is counted inside the given venv {args.full_venv} (e.g. [dev], a superset of "
                "[all]): only the distributions that fedapp[all] and pip need, transitively, as installed there."
            )
        lean_f, full_f = installs[0].footprint, installs[-1].footprint
        size_ratio = lean_f.other_megabytes / full_f.other_megabytes
        count_ratio = lean_f.other_packages / full_f.other_packages
        flwr_share = flwr_in(lean)

    jobs = [(m, args.method, lean) for m in models] + ([(CLIP_MODEL, CLIP_METHOD, clip)] if clip else [])
    rows = []
    for model, method, python in jobs:
        print(f"in-process: {model} ({method}) ...", flush=True)
        rows.append(measure_in_process(python, model, method, data_dir, work, startup_runs))
    if chosen:
        full_bin = args.full_venv / "bin" if args.full_venv is not None else work / "full" / "bin"
        supernode_rounds(rows, [python for *_, python in jobs], chosen, full_bin, data_dir, work, args.run_timeout)

    cnn1 = next((r for r in rows if r.model == "cnn-1"), None)
    goal, goal_from = None, ""
    if cnn1 is not None and cnn1.clientapp_rss_mb is not None:
        goal, goal_from = cnn1.clientapp_rss_mb, "peak of the ClientApp processes of a real SuperNode"
    elif cnn1 is not None:
        goal, goal_from = cnn1.round_rss_mb, "in-process: imports, fit and evaluate in one process"
    notes.append(DEFINITIONS)
    notes.extend(f"{r.model}: {r.note}" for r in rows if r.note)
    load = (load_at_start, os.getloadavg()[0])
    notes.append(
        f"1-minute load average at the start and the end: {load[0]:.1f}, {load[1]:.1f} ({os.cpu_count()} CPUs)."
    )
    return Report(rows, installs, rows[0].torch, size_ratio, count_ratio, goal, goal_from, notes, flwr_share, load)


if __name__ == "__main__":
    if sys.argv[1:2] == [WORKER]:
        worker(sys.argv[2], startup_only="--startup-only" in sys.argv[3:])
    else:
        main()
