"""Where a launch's time goes, and how busy it keeps the GPU.

    python benchmarks/launch_phases.py --preset conf/sdfed-vitb16.yaml --gpus-per-client 0.25
    python benchmarks/launch_phases.py --preset conf/pep-fedpt-vitb16.yaml --gpus-per-client 0.1
    python benchmarks/launch_phases.py --smoke            # a tiny CPU run: the phases, no GPU

Runs ``python -m fedapp.launch`` on a preset at its paper's sizes (clients, shots, image
size, precision) with a random-init backbone (``pretrained=""``) on generated images
(an ImageFolder of ``--classes`` classes, ``--images-per-class`` each, at ``--image-px``),
timestamps every line the launch prints and reads its phases off them:

* Flower: the launcher's start, the local SuperLink, the run's submission (its FAB built);
* simulation: Flower's simulation process and Ray, up to the ServerApp's first line;
* ServerApp: the data checked and partitioned (up to ``results go to``);
* workers: until the first Ray worker (``ClientAppActor``) prints;
* backbone: each worker's ``backbone ... loaded ... in X s`` line (the slowest);
* rounds: every round's seconds (Flower's round line), round 1 against the steady ones
  (round 1's extra is the backbone loads, the image encoding, the workers' warm-up);
* shutdown: from the last round to the launcher's exit.

With a GPU and ``nvidia-ml-py`` installed it samples NVML every ``--sample-every`` seconds:
the GPU's busy share (samples with utilisation above 0) past round 1, and the peak memory of
each process on it (each Ray worker, the ServerApp), from which it suggests clients per GPU.
Prints a table and, with ``--out``, writes the figures as JSON. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

MARKERS = {
    "superlink": re.compile(r"Using SuperLink: local"),
    "submitted": re.compile(r"Successfully started run"),
    "simulation": re.compile(r"Starting Flower Simulation"),
    "serverapp": re.compile(r"results go to "),
    "worker": re.compile(r"\(ClientAppActor pid=\d+\)"),
    "done": re.compile(r"done: round \d+/\d+"),
}
ROUND = re.compile(r"\bround (\d+)/\d+ \|.*\| ([\d.]+)s \| elapsed")
BACKBONE = re.compile(r"backbone \S+ \(\w+\) loaded on \S+ in ([\d.]+) s")
SMOKE_CONFIG = 'clip-model="fedapp-tiny-clip" precision="fp32" device="cpu" image-size=32 shots-per-class=4'


@dataclass
class GpuSamples:
    """NVML samples: (seconds since start, utilisation %) and each process's peak memory."""

    utilisation: list[tuple[float, int]] = field(default_factory=list)
    peak_mib_by_pid: dict[int, float] = field(default_factory=dict)
    total_mib: float = 0.0
    name: str = ""


@dataclass
class Phases:
    """Seconds since the launcher started at which each marker was first seen."""

    seen: dict[str, float] = field(default_factory=dict)
    rounds: list[float] = field(default_factory=list)
    round_ends: list[float] = field(default_factory=list)
    backbone_loads: list[float] = field(default_factory=list)
    exit_at: float = 0.0
    returncode: int = 0

    def read(self, at: float, line: str) -> None:
        for name, pattern in MARKERS.items():
            if name not in self.seen and pattern.search(line):
                self.seen[name] = at
        if (match := ROUND.search(line)) and "done:" not in line:
            self.rounds.append(float(match[2]))
            self.round_ends.append(at)
        if match := BACKBONE.search(line):
            self.backbone_loads.append(float(match[1]))


def generate_images(folder: Path, classes: int, per_class: int, px: int, seed: int = 0) -> Path:
    """An ImageFolder of random images (reused when it is already there)."""
    from PIL import Image  # noqa: PLC0415

    done = folder / ".complete"
    if done.exists() and done.read_text() == f"{classes} {per_class} {px}":
        return folder
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (folder / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (px, px, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"class_{c:03d}" / f"{i:04d}.png")
    done.write_text(f"{classes} {per_class} {px}")
    return folder


def sample_gpu(stop: threading.Event, started: float, every: float, into: GpuSamples) -> None:
    """Samples NVML until ``stop`` is set (no GPU or no NVML: returns at once, nothing sampled)."""
    try:
        import pynvml  # noqa: PLC0415 - nvidia-ml-py, only where there is a GPU
    except ImportError:
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver: no GPU to sample
        return
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        into.name = str(pynvml.nvmlDeviceGetName(handle))
        into.total_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
        while not stop.wait(every):
            busy = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            into.utilisation.append((time.perf_counter() - started, int(busy)))
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = (process.usedGpuMemory or 0) / 2**20
                into.peak_mib_by_pid[process.pid] = max(into.peak_mib_by_pid.get(process.pid, 0.0), used)
    finally:
        pynvml.nvmlShutdown()


def launch(argv: list[str], phases: Phases, started: float, echo: bool) -> None:
    """Run the launcher, timestamping every line it prints."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedapp.launch", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        at = time.perf_counter() - started
        phases.read(at, line)
        if echo:
            print(f"{at:8.2f}  {line.rstrip()}", flush=True)
    phases.returncode = proc.wait()
    phases.exit_at = time.perf_counter() - started


def summarise(phases: Phases, gpu: GpuSamples) -> dict[str, float | int | str | None]:
    """The figures: each phase's seconds, rounds, GPU busy share and memory."""
    seen = phases.seen
    steady = phases.rounds[1:]

    def span(start: str | None, end: str) -> float | None:
        if end not in seen or (start is not None and start not in seen):
            return None
        return seen[end] - (0.0 if start is None else seen[start])

    figures: dict[str, float | int | str | None] = {
        "flower_start_s": span(None, "submitted"),
        "simulation_start_s": span("submitted", "serverapp"),
        "workers_start_s": span("serverapp", "worker"),
        "backbone_load_s": max(phases.backbone_loads) if phases.backbone_loads else None,
        "backbone_loads": len(phases.backbone_loads),
        "round_1_s": phases.rounds[0] if phases.rounds else None,
        "steady_round_s": float(np.mean(steady)) if steady else None,
        "rounds": len(phases.rounds),
        "shutdown_s": None if "done" not in seen else phases.exit_at - seen["done"],
        "launch_s": phases.exit_at,
        "fixed_cost_s": phases.exit_at - sum(phases.rounds) if phases.rounds else None,
        "returncode": phases.returncode,
        "gpu": gpu.name or None,
    }
    if figures["round_1_s"] is not None and figures["steady_round_s"] is not None:
        figures["round_1_extra_s"] = figures["round_1_s"] - figures["steady_round_s"]
    if gpu.utilisation and phases.round_ends and "done" in seen:
        window = [busy for at, busy in gpu.utilisation if phases.round_ends[0] <= at <= seen["done"]]
        figures["gpu_busy_share_after_round_1"] = sum(b > 0 for b in window) / len(window) if window else None
        figures["gpu_mean_utilisation_after_round_1"] = float(np.mean(window)) if window else None
    if gpu.peak_mib_by_pid:
        peaks = sorted(gpu.peak_mib_by_pid.values())
        figures["gpu_processes"] = len(peaks)
        figures["gpu_peak_mib_per_process_max"] = peaks[-1]
        figures["gpu_total_mib"] = gpu.total_mib
        # What fits beside each other with a tenth of the GPU kept free.
        figures["clients_per_gpu_by_memory"] = math.floor(0.9 * gpu.total_mib / peaks[-1])
    return figures


def print_table(figures: dict[str, float | int | str | None]) -> None:
    print("| figure | value |\n|---|---|")
    for name, value in figures.items():
        shown = "—" if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))
        print(f"| {name} | {shown} |")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="conf/sdfed-vitb16.yaml")
    parser.add_argument("--gpus-per-client", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--images-per-class", type=int, default=40)
    parser.add_argument("--image-px", type=int, default=32, help="side of the generated images")
    parser.add_argument("--data-dir", type=Path, help="where to generate the images (default: a temporary folder)")
    parser.add_argument("--run-config", default="", help="more overrides, Flower's syntax")
    parser.add_argument("--sample-every", type=float, default=0.25, help="seconds between NVML samples")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--echo", action="store_true", help="print the launch's lines as they come, timestamped")
    parser.add_argument("--smoke", action="store_true", help="a tiny CPU run of sdfed-digits' method")
    return parser


def main(argv: list[str] | None = None) -> dict[str, float | int | str | None]:
    args = _parser().parse_args(argv)
    if args.smoke:
        args.preset, args.gpus_per_client, args.rounds = "conf/sdfed-digits.yaml", 0.0, 2
        args.classes, args.images_per_class, args.run_config = 4, 12, f"{SMOKE_CONFIG} num-partitions=2"
    with tempfile.TemporaryDirectory(prefix="launch-phases-") as scratch:
        data = generate_images(
            args.data_dir or Path(scratch) / "images", args.classes, args.images_per_class, args.image_px
        )
        overrides = (
            f'pretrained="" dataset="imagefolder" data-dir="{data}" test-data-dir="" download=false '
            f'num-rounds={args.rounds} results-dir="{Path(scratch) / "results"}" {args.run_config}'
        )
        launcher = ["--preset", str(ROOT / args.preset), "--run-config", overrides]
        launcher += ["--gpus-per-client", str(args.gpus_per_client), "--flwr-home", str(Path(scratch) / "flwr")]
        phases, gpu, stop = Phases(), GpuSamples(), threading.Event()
        started = time.perf_counter()
        sampler = threading.Thread(target=sample_gpu, args=(stop, started, args.sample_every, gpu), daemon=True)
        sampler.start()
        try:
            launch(launcher, phases, started, args.echo)
        finally:
            stop.set()
            sampler.join(timeout=5)
    figures = {"preset": args.preset, "gpus_per_client": args.gpus_per_client, **summarise(phases, gpu)}
    print_table(figures)
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["returncode"] == 0 else 1)
