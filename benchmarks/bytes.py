"""Bytes on the wire against the payload, per method and round, for one client.

For every method it builds one real client as the ClientApp does and the
method's strategy, takes round 1's fit instruction (down) and the client's
reply (up), and counts each at four layers:

* payload: the raw bytes of the arrays the method must send (``ndarray.nbytes``);
* counted: what our metrics count (``fedapp.metrics.payload_bytes``: the ``.npy``
  tensors in ``Parameters``, so the arrays plus one ``.npy`` header each);
* protobuf: every Fleet API request and response body that delivers the message;
* wire: the same with their HTTP/1.1 request and status lines and headers.

The wire is measured by driving Flower 1.42's own SuperNode client
(``FleetHttpClient`` with its version and node-authentication interceptors, and
Flower's pull/push/confirm helpers) against an in-process stand-in for the
SuperLink that answers as its Fleet handlers do, with the headers its uvicorn
server adds: the message
is converted as Flower's compat layer does (``fitins_to_recorddict`` /
``fitres_to_recorddict``), broken into Flower's content-addressed objects
(Message, RecordDict, records, Array, ArrayChunk), and the SuperNode pulls or
pushes each one in its own request (``fleet_traffic.py`` holds the stand-in and the
counting). TCP/IP and TLS framing are not counted.
Shapes do not change from round to round, so round 1 stands for every round::

    python benchmarks/bytes.py            # every method, the run defaults
    python benchmarks/bytes.py --smoke    # a few methods, tiny models (CI)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import numpy as np
import torch
from flwr.app import Message, Metadata, RecordDict
from flwr.client import Client
from flwr.common import Context, FitIns, FitRes, MessageType, Parameters, parameters_to_ndarrays
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.common.recorddict_compat import (
    fitins_to_recorddict,
    fitres_to_recorddict,
    recorddict_to_fitins,
    recorddict_to_fitres,
)
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from fedapp.catalog import CATALOG, METHODS
from fedapp.client_app import make_client_fn
from fedapp.config import defaults, resolve_run_config
from fedapp.metrics import payload_bytes
from fedapp.server_app import build_strategy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import fmt_count, markdown_table
from fleet_traffic import NODE_ID, RUN_ID, SuperLinkStandIn, Traffic

from fedapp.flower.driver import stand_in_manager

TARGET = 1.05
#: Methods of the smoke run: nothing, a full model, per-class statistics, a text prompt.
SMOKE_METHODS = ("fedavg", "standalone", "fedproto", "promptfl")
#: What each method sends (up, down) in a round.
TRAVELS = {
    "fedavg": ("full model", "full model"),
    "standalone": ("nothing", "nothing"),
    "pfedlora": ("adapter", "adapter"),
    "lg-fedavg": ("classifier head", "classifier head"),
    "fedproto": ("prototypes + counts", "prototypes + mask"),
    "fd": ("mean logits + counts", "mean logits + mask"),
    "fml": ("shared small model", "shared small model"),
    "fedkd": ("shared small model", "shared small model"),
    "coop-local": ("nothing", "nothing"),
    "promptfl": ("text prompt", "text prompt"),
    "sdfed": ("global prompt", "global prompt"),
    "head-fedavg": ("linear head", "linear head"),
    "local-vpt": ("nothing", "nothing"),
    "fedvpt": ("visual prompt + head", "visual prompt + head"),
    "fedvpt-d": ("deep visual prompts + head", "deep visual prompts + head"),
    "pep-fedpt": ("prompts + CLS means + counts", "prompts + prototypes + mask"),
    "fedd2p": ("soft labels + counts", "soft labels + mask"),
    "fedd2p-agg": ("soft labels + counts", "soft labels + mask"),
    "fedd2p-gt": ("soft labels + counts", "soft labels + mask"),
}
#: Settings that make every method cheap to build and train once; none changes what is sent.
COMMON = {
    "dataset": "digits",
    "num-partitions": 2,
    "min-clients": 2,
    "num-rounds": 1,
    "local-epochs": 1,
    "batch-size": 16,
    "shots-per-class": 4,
    "partition": "iid",
    "device": "cpu",
    "d2p-steps": 1,
}
#: The smoke run's tiny models and prompts (these do change what is sent).
SMOKE = {"model": "cnn-5", "image-size": 16, "prompt-length": 2}


def method_overrides(method: str, smoke: bool) -> dict[str, Any]:
    """Run-config keys of one method's measurement."""
    out: dict[str, Any] = {**COMMON, "method": method, **(SMOKE if smoke else {})}
    if CATALOG[method].backbone == "clip-vision":
        out["clip-model"] = "fedapp-tiny-vit"  # the visual-prompt methods need a ViT image tower
    if method == "sdfed":
        # Local prompts stay on the client; the default random:4-64 overflows the tiny CLIP's 32-token context.
        out["local-prompt-lengths"] = "4,16"
    return out


# ----- one method ----------------------------------------------------------------


@dataclass
class Direction:
    """One direction of one round for one client."""

    arrays: list[np.ndarray]
    counted: int
    objects: int  # Flower's deflated objects (what the SuperLink meters for object traffic)
    traffic: Traffic

    @property
    def params(self) -> int:
        return sum(int(a.size) for a in self.arrays)

    @property
    def payload(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    @property
    def ratio(self) -> float:
        """Wire bytes per payload byte (inf when nothing has to be sent)."""
        return self.traffic.http / self.payload if self.payload else float("inf")


@dataclass
class Row:
    method: str
    up: Direction
    down: Direction
    seconds: float = 0.0

    @property
    def within_target(self) -> bool | None:
        ratios = [d.ratio for d in (self.up, self.down) if d.payload]
        return None if not ratios else max(ratios) <= TARGET


def fit_instruction(overrides: Mapping[str, Any]) -> FitIns:
    """Round 1's fit instruction from the method's strategy, as the ServerApp builds it."""
    config = resolve_run_config(dict(overrides))
    strategy = build_strategy(config, record=False)
    manager = stand_in_manager(config.num_partitions)
    parameters = strategy.initialize_parameters(manager)
    instructions = strategy.configure_fit(1, parameters, manager)
    return instructions[0][1]


def build_client(overrides: Mapping[str, Any]) -> Client:
    """Partition 0's client, built as the ClientApp builds it on a SuperNode."""
    num_partitions = int(overrides["num-partitions"])
    context = Context(
        run_id=RUN_ID,
        node_id=NODE_ID,
        node_config={"partition-id": 0, "num-partitions": num_partitions},
        state=RecordDict(),
        run_config=defaults(),  # what Flower hands the ClientApp: the pyproject table
    )
    return make_client_fn(overrides)(context)


def instruction_message(fit_ins: FitIns) -> Message:
    """The legacy instruction as Flower's compat grid sends it (``GridClientProxy.fit``)."""
    metadata = Metadata(
        run_id=RUN_ID,
        message_id="",
        src_node_id=SUPERLINK_NODE_ID,
        dst_node_id=NODE_ID,
        reply_to_message_id="",
        group_id="1",
        created_at=time.time(),
        ttl=43200.0,
        message_type=MessageType.TRAIN,
    )
    return Message(metadata=metadata, content=fitins_to_recorddict(fit_ins, keep_input=True))


def measure(method: str, overrides: Mapping[str, Any], link: SuperLinkStandIn) -> Row:
    started = time.perf_counter()
    fit_ins = fit_instruction(overrides)
    instruction = instruction_message(fit_ins)
    down_traffic, down_content = link.deliver_instruction(instruction)
    received = recorddict_to_fitins(down_content, keep_input=True)  # as the ClientApp's message handler does
    assert received.parameters.tensors == fit_ins.parameters.tensors, "the node received other arrays than were sent"

    client = build_client(overrides)
    fit_res: FitRes = client.fit(received)
    reply = Message(fitres_to_recorddict(fit_res, keep_input=True), reply_to=instruction)
    up_traffic, up_content = link.deliver_reply(reply)
    assert recorddict_to_fitres(up_content, keep_input=True).parameters.tensors == fit_res.parameters.tensors

    def direction(parameters: Parameters, message: Message, traffic: Traffic) -> Direction:
        objects = sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())
        return Direction(parameters_to_ndarrays(parameters), payload_bytes(parameters.tensors), objects, traffic)

    return Row(
        method,
        up=direction(fit_res.parameters, reply, up_traffic),
        down=direction(fit_ins.parameters, instruction, down_traffic),
        seconds=time.perf_counter() - started,
    )


# ----- tables ----------------------------------------------------------------------


def _ratio(direction: Direction) -> str:
    return "—" if not direction.payload else f"{direction.ratio:.2f}"


def _verdict(row: Row) -> str:
    within = row.within_target
    return "— (nothing to send)" if within is None else ("yes" if within else "no")


def main_table(rows: Sequence[Row]) -> str:
    header = [
        "method",
        "up: what travels",
        "down: what travels",
        "params up / down",
        "arrays up / down",
        "payload B up / down",
        "counted B up / down",
        "wire B up / down",
        "wire/payload up / down",
        f"≤ {TARGET}",
    ]
    body = []
    for r in rows:
        up, down = TRAVELS.get(r.method, ("?", "?"))
        body.append(
            [
                r.method,
                up,
                down,
                f"{fmt_count(r.up.params)} / {fmt_count(r.down.params)}",
                f"{len(r.up.arrays)} / {len(r.down.arrays)}",
                f"{r.up.payload:,} / {r.down.payload:,}",
                f"{r.up.counted:,} / {r.down.counted:,}",
                f"{r.up.traffic.http:,} / {r.down.traffic.http:,}",
                f"{_ratio(r.up)} / {_ratio(r.down)}",
                _verdict(r),
            ]
        )
    return markdown_table(header, body)


def overhead_table(rows: Sequence[Row]) -> str:
    """Where the bytes above the payload come from, up and down together."""
    header = [
        "method",
        "payload B",
        ".npy headers",
        "Flower objects",
        "protobuf RPCs",
        "HTTP/1.1 lines + headers",
        "HTTP requests",
        "wire/payload",
    ]
    body = []
    for r in rows:
        ds = (r.up, r.down)
        payload = sum(d.payload for d in ds)
        counted = sum(d.counted for d in ds)
        objects = sum(d.objects for d in ds)
        protobuf = sum(d.traffic.protobuf for d in ds)
        http = sum(d.traffic.http for d in ds)
        requests = sum(d.traffic.requests for d in ds)
        body.append(
            [
                r.method,
                f"{payload:,}",
                f"+{counted - payload:,}",
                f"+{objects - counted:,}",
                f"+{protobuf - objects:,}",
                f"+{http - protobuf:,} ({(http - protobuf) // requests:,}/request)",
                str(requests),
                "—" if not payload else f"{http / payload:.2f}",
            ]
        )
    return markdown_table(header, body)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help=f"tiny models, methods {','.join(SMOKE_METHODS)}")
    parser.add_argument("--methods", help="comma list (default: every method; with --smoke, the smoke set)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    methods = args.methods.split(",") if args.methods else list(SMOKE_METHODS if args.smoke else METHODS)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods: {', '.join(unknown)}")
    torch.set_num_threads(args.threads)
    link = SuperLinkStandIn()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedapp-bytes-") as scratch:
        for method in methods:
            overrides = {**method_overrides(method, args.smoke), "results-dir": scratch, "state-dir": scratch}
            row = measure(method, overrides, link)
            print(f"{method}: {row.seconds:.1f}s", file=sys.stderr, flush=True)
            rows.append(row)
    print(main_table(rows))
    print()
    print(overhead_table(rows))
    return rows


if __name__ == "__main__":
    main()
