"""Every preset in ``conf/`` learns from round 1: a brief in-process run of each, on data that ships.

The presets are found with a glob, so a new one is checked without touching this file. The offline
presets (``dataset: digits``) run in full, on their own backbones, in ``test_presets_accuracy.py``,
whose checks are stronger; this module runs the others, whose data or weights no test machine has. Each runs in
this process (:func:`fedapp.inprocess.run_in_process`) for a few rounds with the method settings of
the preset kept: method, partition, optimiser, ``lr``, ``momentum``, local and warm-up epochs, batch
size, zoo models, ``mu``, prompt lengths and layers, temperatures, fractions, held-out share.

What a brief run overrides (:func:`brief_run_config`), and why:

* Presets on ``digits`` whose clients train zoo CNNs (the runs users start with) keep their clients
  and all of their data.
* Every other preset runs on ``dataset="digits"`` (the CIFAR-10/100 and ImageFolder data are on no
  test machine) on at most :data:`MAX_CLIENTS` clients, with 20% of every class as the clients'
  shared test pool (``reserve-test=0.2``: some 70 test images a client rather than 15) and, unless
  its clients train zoo CNNs, 40% never loaded (``reserve-pretrain=0.4``: less to encode and train
  on). A preset that carves its own reserve keeps it.
* ``pretrained=""`` (no weights ship, none download) and, where a preset names another backbone
  (ViT-B-16, ViT-B-32, ``fedapp-small-clip``), the random-init config that ships for its kind
  (:data:`SHIPPED_BACKBONES`): ``fedapp-tiny-vit`` for the image-tower methods (the one
  ``pep-fedpt-digits`` uses; it has the blocks that class-prompt layers 5,6,7 need),
  ``fedapp-tiny-clip`` for the others.
* ``device="cpu"``, ``precision="fp32"`` (the GPU presets ask for CUDA and fp16) and
  ``image-size=16`` for zoo CNNs (digits are 8x8 images; a quarter of the cost of 32), 32 for the
  CLIP backbones, which read 32 pixels.
* ``num-rounds``: enough for a client to take about :data:`LOCAL_STEPS` SGD steps in all (a
  CIFAR-10 schedule, 1 epoch of batch 64, is a few steps a round on a digits client), at least
  :data:`MIN_ROUNDS`; :data:`FROZEN_BACKBONE_ROUNDS` on a frozen backbone.
* The entries of :data:`ADAPTATIONS`, each with its reason.

What is asserted depends on what a client trains (``fedapp.catalog``'s ``backbone``):

* Its own CNN (``cnn``; ``cnn+server-clip``, FedD2P's devices): **accuracy rises**. The last round's
  mean client accuracy is at least :data:`RISE` above round 1's and above chance (1 / classes), and
  no round falls more than :data:`DIP` below round 1 (no collapse, such as every client of
  ``pfedlora-digits`` predicting one class by round 3 before its fix). The presets that keep all of
  their data must also rise round over round in the first 3 rounds (within :data:`STEP_NOISE`).
* Prompts and heads on a frozen CLIP or ViT (``clip-text``, ``clip-vision``): that backbone is
  random-init here, and its image features point nearly one way (mean pairwise cosine 0.997 for
  ``fedapp-tiny-clip`` on digits, zero-shot accuracy 0.10), so no prompt moves test accuracy out of
  chance's noise in a few rounds (measured: 8 rounds of CoOp-local, PromptFL and SDFed on digits,
  and 5 on a tiny CLIP first pretrained on digits for 20 s). What is asserted is that **training
  learns and does not diverge**: the last round's training loss is below round 1's, and no round's
  rises more than :data:`LOSS_NOISE` above round 1's.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from fedapp.catalog import CATALOG
from fedapp.clientdata import load_client_data
from fedapp.config import resolve_run_config
from fedapp.config.run_config import load_preset
from fedapp.config.schema import APP_ROOT, DATASET_CLASSES, SCHEMA
from fedapp.inprocess import run_in_process
from fedapp.metrics import RoundRecord

PRESETS = sorted(
    path for path in (APP_ROOT / "conf").glob("*.yaml") if load_preset(str(path)).get("dataset") != "digits"
)

MAX_CLIENTS = 5
"""5 clients of 2 classes cover digits' 10 classes in a pathological split, and a 0.2 fraction
(clients sampled a round, held-out clients) is one whole client."""

MIN_ROUNDS = {"cnn": 3, "cnn+server-clip": 4}
"""FedD2P's devices warm up on cross-entropy in round 1 and first distil in round 2, so its rise shows from round 3."""
LOCAL_STEPS = 30
FROZEN_BACKBONE_ROUNDS = 3
RISE = 0.05
DIP = {"cnn": 0.05, "cnn+server-clip": 0.10}
"""FedD2P's devices train on cross-entropy alone in round 1 (S0) and distil from round 2 on; here the
server's CLIP is random-init, and its near-flat class distributions cost up to 8 points in that round."""
STEP_NOISE = 0.02
LOSS_NOISE = 0.05

SHIPPED_BACKBONES = {"clip-text": "fedapp-tiny-clip", "clip-vision": "fedapp-tiny-vit"}
"""The random-init config that stands in for a backbone this machine does not have, by what a client runs."""

ADAPTATIONS: dict[str, tuple[dict[str, Any], str]] = {
    "sdfed-vitb16": (
        {"local-prompt-lengths": "random:4-16"},
        "local prompts of up to 64 tokens need ViT-B-16's 77-token text context; fedapp-tiny-clip reads 32",
    ),
    "pep-fedpt-vitb16": (
        {"lr": 0.01},
        "lr 0.05 is the paper's for a pretrained ViT-B/16; on the random-init tiny ViT standing in for it "
        "the training loss climbs (2.45, 2.39, 2.69 over 3 rounds); at 0.01 it falls",
    ),
    "claims-family-d": (
        {"local-epochs": 1},
        "5 local epochs take every 2-class client to its label prior's loss (ln 2) within round 1 on the "
        "random-init ViT, leaving nothing to fall across rounds; at 1 epoch the same prompts show it",
    ),
    "claims-family-c": (
        {"batch-size": 32},
        "batch 128 over a device's few digits images (1-3 classes at alpha 0.1, 72 images a class in the "
        "federated share) is 1 SGD step an epoch, so a brief run would need 15 rounds (45 s); at batch 32 an "
        "epoch is 4-5 steps",
    ),
    "claims-family-b-fedavg-cnn": (
        {"num-rounds": 5},
        "at Dirichlet 0.1 a client mostly holds one class, so round 1 already scores its share (0.6-0.7) "
        "and plain SGD (momentum 0) needs 5 rounds to rise past it (seed 1: 0.62, 0.57, 0.61, 0.63, 0.74)",
    ),
    "fedd2p-cifar10": (
        {"shots-per-class": 10},
        "the paper's 10 local and 10 warm-up epochs of VGG over all of a device's images take minutes "
        "on 2 cores; 10 images a class keep the schedule (epochs, batch 128, lr) and cut the data",
    ),
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def backbone_of(values: dict[str, Any]) -> str:
    """What the preset's clients train (``fedapp.catalog``): ``cnn``, ``clip-text``, ``clip-vision``..."""
    return CATALOG[str(values.get("method", SCHEMA["method"].default))].backbone


def keeps_its_data(preset: Path) -> bool:
    """A preset on digits whose clients train zoo CNNs: the runs users start with, checked on all their data."""
    values = load_preset(str(preset))
    return values.get("dataset", SCHEMA["dataset"].default) == "digits" and backbone_of(values) == "cnn"


def mean_local_steps(values: dict[str, Any]) -> float:
    """The SGD steps a client takes in a round, on average over the clients."""
    config = resolve_run_config(values)
    clients = config.num_partitions
    sizes = [len(load_client_data(config, client, clients).splits["train"].labels) for client in range(clients)]
    return config.local_epochs * sum(math.ceil(size / config.batch_size) for size in sizes) / clients


def brief_run_config(preset: Path, results_dir: Path) -> dict[str, Any]:
    """The preset's values with the overrides of a brief run here (see the module docstring).

    The dict holds every key of the preset itself rather than naming it in ``preset``: an override
    equal to a schema default (``dataset="digits"``, ``pretrained=""``) does not win over a preset
    that ``resolve_run_config`` layers under it.
    """
    values = dict(load_preset(str(preset)))
    backbone = backbone_of(values)
    if not keeps_its_data(preset):
        values.update({"dataset": "digits", "data-dir": "", "test-data-dir": "", "download": False})
        if not values.get("reserve-pretrain") and not values.get("reserve-test"):
            # Zoo-CNN clients keep 80% of the data, so that a CIFAR-10 schedule's round has steps
            # enough for momentum to build; the others take 40% (a frozen backbone's passes and
            # FedD2P's VGG devices are what these runs pay for).
            values.update({"reserve-pretrain": 0.0 if backbone == "cnn" else 0.4, "reserve-test": 0.2})
        clients = int(values.get("num-partitions", SCHEMA["num-partitions"].default))
        values["num-partitions"] = min(MAX_CLIENTS, clients)
    image_size = 32 if backbone in SHIPPED_BACKBONES else 16
    values.update({"pretrained": "", "device": "cpu", "precision": "fp32", "image-size": image_size})
    stand_in = SHIPPED_BACKBONES.get(backbone, SHIPPED_BACKBONES["clip-text"])
    if backbone != "cnn" and not str(values.get("clip-model", stand_in)).startswith("fedapp-tiny-"):
        values["clip-model"] = stand_in
    values.update(ADAPTATIONS.get(preset.stem, ({}, ""))[0])
    values["results-dir"] = str(results_dir)
    if "num-rounds" not in ADAPTATIONS.get(preset.stem, ({}, ""))[0]:
        values["num-rounds"] = brief_rounds(values, backbone)
    return values


def brief_rounds(values: dict[str, Any], backbone: str) -> int:
    """Rounds of a brief run: :data:`FROZEN_BACKBONE_ROUNDS`, or enough for about :data:`LOCAL_STEPS` steps."""
    if backbone in SHIPPED_BACKBONES:
        return FROZEN_BACKBONE_ROUNDS
    return max(MIN_ROUNDS[backbone], math.ceil(LOCAL_STEPS / mean_local_steps(values)))


def assert_accuracy_rises(history: list[RoundRecord], *, dip: float, round_over_round: bool) -> None:
    accuracy = [record.acc_mean for record in history]
    chance = 1 / DATASET_CLASSES["digits"]
    assert accuracy[-1] >= accuracy[0] + RISE, f"mean accuracy did not rise by {RISE}: {accuracy}"
    assert accuracy[-1] > chance, f"mean accuracy ends at chance ({chance}) or below: {accuracy}"
    assert min(accuracy) >= accuracy[0] - dip, f"a round's mean accuracy fell below round 1's - {dip}: {accuracy}"
    if round_over_round:
        steps = [later - earlier for earlier, later in itertools.pairwise(accuracy[:3])]
        assert min(steps) >= -STEP_NOISE, f"mean accuracy fell in the first 3 rounds: {accuracy}"


def assert_training_learns(history: list[RoundRecord]) -> None:
    loss = [record.train_loss for record in history]
    assert all(math.isfinite(value) for value in loss), f"a training loss is not finite: {loss}"
    assert loss[-1] < loss[0], f"the training loss did not fall: {loss}"
    assert max(loss) <= loss[0] + LOSS_NOISE, f"a round's training loss rose above round 1's + {LOSS_NOISE}: {loss}"


def test_every_preset_is_checked():
    # An empty glob (a moved conf/) would check nothing, and an adaptation whose preset was renamed
    # would silently stop applying.
    assert len(PRESETS) >= 14
    assert set(ADAPTATIONS) <= {path.stem for path in PRESETS}
    assert all(reason for _, reason in ADAPTATIONS.values())


@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.stem)
def test_preset_learns_from_round_1(preset: Path, tmp_path: Path) -> None:
    values = brief_run_config(preset, tmp_path)
    history = run_in_process(values).history
    assert [record.round for record in history] == list(range(1, values["num-rounds"] + 1))
    backbone = backbone_of(values)
    if backbone in SHIPPED_BACKBONES:
        assert_training_learns(history)
    else:
        assert_accuracy_rises(history, dip=DIP[backbone], round_over_round=keeps_its_data(preset))


def test_the_accuracy_check_catches_the_collapse_it_was_written_for(tmp_path: Path) -> None:
    # pfedlora-digits before its fix (lr 0.05, 1 local epoch): its clients fall back to one class.
    values = brief_run_config(APP_ROOT / "conf" / "pfedlora-digits.yaml", tmp_path)
    values.update({"lr": 0.05, "local-epochs": 1, "num-rounds": 3})
    history = run_in_process(values).history
    with pytest.raises(AssertionError, match="mean accuracy"):
        assert_accuracy_rises(history, dip=DIP["cnn"], round_over_round=True)


def test_the_frozen_backbone_check_catches_a_diverging_prompt(tmp_path: Path) -> None:
    values = brief_run_config(APP_ROOT / "conf" / "promptfl-digits.yaml", tmp_path)
    # The carve this was written on (the preset's own half-and-tenth reserve leaves the random tower's
    # near-constant features, on which no lr moves the loss: 2.32, 2.31, 2.31 at lr 5, 20 and 50).
    values.update({"lr": 5.0, "reserve-pretrain": 0.4, "reserve-test": 0.2})
    with pytest.raises(AssertionError, match="training loss"):
        assert_training_learns(run_in_process(values).history)
