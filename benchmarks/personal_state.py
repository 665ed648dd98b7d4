"""What a client with personal state on disk spends per message outside training.

A client with ``state = "disk"`` (pFedLoRA and the other personalised methods) reads its
personal model and builds it at the start of every message and writes it at the
end of a fit. This times both for every zoo model, over many clients in one
process, as a simulation worker serves them, two ways, taken in turn for each client:

- ``npz + build``: the format and the path of releases before 2026-12 (``np.savez``,
  ``np.load``, a model copied from a seeded template, then overwritten);
- ``safetensors + assign``: what :class:`fedapp.state.DiskStateStore` and
  :meth:`fedapp.clients.base.FedAppClient.load_personal_model` do now (the model is built
  on the ``meta`` device and given the stored tensors).

It prints the median milliseconds per client of each step::

    python benchmarks/personal_state.py --clients 200 --models cnn-1 cnn-3 cnn-5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedapp.models import seeded_model
from fedapp.params import named_arrays_to_state, state_to_named_arrays
from fedapp.state import DiskStateStore


@dataclass(frozen=True)
class Row:
    model: str
    megabytes: float
    way: str
    save_ms: float
    load_ms: float


def _median_ms_each(steps: Sequence[Callable[[int], object]], clients: int) -> list[float]:
    """Each step's median milliseconds over ``clients``, the steps taken in turn for every
    client so that both ways meet the same page cache and write-back."""
    times: list[list[float]] = [[] for _ in steps]
    for client in range(clients):
        for step, samples in zip(steps, times, strict=True):
            started = time.perf_counter()
            step(client)
            samples.append(time.perf_counter() - started)
    return [1000 * statistics.median(samples) for samples in times]


def measure(model_name: str, clients: int, folder: Path) -> list[Row]:
    """Save then load-and-build ``clients`` personal models of ``model_name`` both ways."""
    torch.manual_seed(0)
    arrays = state_to_named_arrays(seeded_model(model_name, 10, seed=1))
    megabytes = sum(a.nbytes for a in arrays.values()) / 1e6

    def npz_path(client: int) -> Path:
        return folder / f"npz-{model_name}-{client}.npz"

    def npz_save(client: int) -> None:
        # As the store did: a temporary file, then a rename.
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(tmp, npz_path(client))

    def npz_load(client: int) -> torch.nn.Module:
        with np.load(npz_path(client), allow_pickle=False) as data:
            stored = {key: data[key] for key in data.files}
        model = seeded_model(model_name, 10, seed=0)
        named_arrays_to_state(model, stored)
        return model

    stores = [DiskStateStore(folder, f"st-{model_name}", client) for client in range(clients)]

    def assigned_load(client: int) -> torch.nn.Module:
        model = seeded_model(model_name, 10, seed=0, materialise=False)
        named_arrays_to_state(model, stores[client].load("model"), assign=True)
        return model

    npz_save_ms, assigned_save_ms = _median_ms_each([npz_save, lambda c: stores[c].save("model", arrays)], clients)
    npz_load_ms, assigned_load_ms = _median_ms_each([npz_load, assigned_load], clients)
    return [
        Row(model_name, megabytes, "npz + build", npz_save_ms, npz_load_ms),
        Row(model_name, megabytes, "safetensors + assign", assigned_save_ms, assigned_load_ms),
    ]


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200, help="personal models per model and way")
    parser.add_argument("--models", nargs="+", default=["cnn-1", "cnn-3", "cnn-5"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as in a simulation worker, one core each
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fedapp-personal-state-") as folder:
        for model_name in args.models:
            rows.extend(measure(model_name, args.clients, Path(folder)))
    print("| model | MB | way | save ms | load and build ms | both ms |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        both = row.save_ms + row.load_ms
        print(f"| {row.model} | {row.megabytes:.1f} | {row.way} | {row.save_ms:.2f} | {row.load_ms:.2f} | {both:.2f} |")
    return rows


if __name__ == "__main__":
    main()
