"""The benchmark scripts run in their smoke mode (tiny sizes), so they cannot rot; no timing is asserted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

pytestmark = pytest.mark.slow


def load_script(name: str):
    """Import ``benchmarks/<name>.py`` as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executing
    spec.loader.exec_module(module)
    return module


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``text``."""
    lines = []
    for line in text.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_bytes_smoke_measures_every_method_and_the_wire_is_never_smaller(capsys):
    bytes_benchmark = load_script("bytes")
    rows = bytes_benchmark.main(["--smoke"])
    printed = table_rows(capsys.readouterr().out)

    methods = list(bytes_benchmark.SMOKE_METHODS)
    assert [r.method for r in rows] == methods
    assert [cells[0] for cells in printed] == methods
    for row, cells in zip(rows, printed, strict=True):
        for direction in (row.up, row.down):
            # Each layer wraps the one below: arrays, .npy tensors, Flower objects, protobuf RPCs, HTTP.
            traffic = direction.traffic
            assert traffic.http > traffic.protobuf >= direction.objects >= direction.counted >= direction.payload
            assert traffic.requests >= 3
        ratios = [part.strip() for part in cells[8].split("/")]
        for ratio, direction in zip(ratios, (row.up, row.down), strict=True):
            if direction.payload:
                assert float(ratio) >= 1.0
                assert direction.ratio >= 1.0
            else:
                assert ratio == "—"  # nothing to send
    by_method = {r.method: r for r in rows}
    assert by_method["standalone"].up.payload == by_method["standalone"].down.payload == 0
    fedavg = by_method["fedavg"]
    assert fedavg.up.params == fedavg.down.params > 0
