"""One client's data: its partition of the source, split train/val/test.

Both the server (to check the data before any training) and the clients call
into here; everything is cached per process, so a simulation worker that
serves many clients decodes and partitions the source once.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from fedapp.backbones import reserve_backbone
from fedapp.config import RESERVE_BACKBONE, RunConfig, held_out_partitions, parse_local_split
from fedapp.data import ArrayDataset, load_source, partition_indices, sample_external_test, split_stratified
from fedapp.data.arrays import resolve_cache_dir
from fedapp.data.reserve import reserve_parts, subset
from fedapp.data.tensors import to_float_tensor
from fedapp.errors import DataError
from fedapp.training import TensorData


@dataclass(eq=False)
class LabelledImages:
    """One split of a client's data: uint8 images (N, H, W, 3) and labels."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @functools.cached_property
    def tensors(self) -> TensorData:
        """Normalised float tensors for the zoo models, built on first use only
        (CLIP methods encode the raw images instead and never need them)."""
        return TensorData(x=to_float_tensor(self.images), y=torch.as_tensor(self.labels, dtype=torch.long))


@dataclass(frozen=True, eq=False)
class ClientData:
    """A client's train/val/test splits and what it knows about its labels.

    Under base-to-novel, ``class_names`` are the base classes the client trains
    and tests on, and the ``test_novel`` split holds its test images of the
    ``novel_class_names`` (labels counted from 0 among the novel classes).
    """

    partition_id: int
    splits: dict[str, LabelledImages]
    class_names: tuple[str, ...]
    novel_class_names: tuple[str, ...] = ()

    @property
    def train(self) -> TensorData:
        return self.splits["train"].tensors

    @property
    def val(self) -> TensorData:
        return self.splits["val"].tensors

    @property
    def test(self) -> TensorData:
        return self.splits["test"].tensors

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def label_counts(self) -> np.ndarray:
        """Examples per class in the training split (the client's label prior)."""
        return np.bincount(self.splits["train"].labels, minlength=self.num_classes)


CLASS_NAMES_KEY = "class-names"
"""Instruction key carrying the server's class names, in label order, to every sampled client."""


def encode_class_names(names: Sequence[str]) -> str:
    """The server's class names as one instruction value (JSON, so any folder name survives)."""
    return json.dumps(list(names))


def check_class_agreement(data: ClientData, server_names: str | None) -> None:
    """Refuse to train or evaluate when this client's classes are not the server's.

    A node that loads its own ``data-dir`` takes its classes from its folder names;
    one folder missing, extra, renamed or cased differently would shift every label
    after it, and the node would train with swapped labels. ``server_names`` is
    :func:`encode_class_names` of the server's list (None: a server that sends none).
    """
    if server_names is None:
        return
    server = json.loads(server_names)
    local = [*data.class_names, *data.novel_class_names]
    if local == server:
        return
    missing = [name for name in server if name not in local]
    unknown = [name for name in local if name not in server]
    if not missing and not unknown:
        problem = "the same names in another order"
    else:
        by_case = {name.casefold() for name in server} == {name.casefold() for name in local}
        problem = "names that differ in case" if by_case else f"missing {missing}, not the server's {unknown}"
    raise DataError(
        f"client {data.partition_id}: its classes {local} are not the server's {server} ({problem}); "
        "labels would be swapped: with its own data-dir a node needs one folder per server class, named exactly alike"
    )


class Source(NamedTuple):
    """Everything the decoded source arrays depend on: the key of every in-process cache of them."""

    dataset: str
    data_dir: str
    hf_name: str
    hf_image_column: str
    hf_label_column: str
    image_size: int
    download: bool
    cache_dir: str


def _source(config: RunConfig, data_dir: str | None = None) -> Source:
    """The configured source, or ``data_dir`` in place of its ``data-dir``."""
    return Source(
        dataset=str(config.dataset),
        data_dir=str(data_dir or config.data_dir),
        hf_name=str(config.hf_name),
        hf_image_column=str(config.hf_image_column),
        hf_label_column=str(config.hf_label_column),
        image_size=int(config.image_size),
        download=bool(config.download),
        cache_dir=str(config.cache_dir),
    )


@functools.lru_cache(maxsize=4)
def _load_cached(source: Source, split: str) -> ArrayDataset:
    return load_source(
        source.dataset,
        data_dir=source.data_dir,
        image_size=source.image_size,
        download=source.download,
        hf_name=source.hf_name,
        hf_image_column=source.hf_image_column,
        hf_label_column=source.hf_label_column,
        split=split,
        cache_dir=source.cache_dir,
    )


def load_dataset(config: RunConfig, split: str = "train", data_dir: str | None = None) -> ArrayDataset:
    """The configured source (or ``data_dir`` in its place), decoded once per process,
    turned into ``synthetic-domains`` domains when that is set.

    With ``reserve-pretrain``/``reserve-test`` set, the configured source's train split
    is its federated part only: the reserved images never reach a client.
    """
    source = _source(config, data_dir)
    if split == "train" and data_dir is None:
        synthetic = config.synthetic_domains
        if synthetic:
            return _synthetic_cached(source, synthetic, config.seed)
        if reserves := _reserves(config):
            return _reserved_cached(source, *reserves, "federated")
    return _load_cached(source, split)


def _reserves(config: RunConfig) -> tuple[float, float, int] | None:
    pretrain, test = config.reserve_pretrain, config.reserve_test
    return (pretrain, test, config.reserve_seed) if pretrain or test else None


@functools.lru_cache(maxsize=2)
def _reserved_cached(source: Source, pretrain: float, test: float, reserve_seed: int, part: str) -> ArrayDataset:
    whole = _load_cached(source, "train")
    parts = reserve_parts(whole.labels, pretrain=pretrain, test=test, seed=reserve_seed)
    return subset(whole, getattr(parts, part))


def clip_weights(config: RunConfig, model_name: str) -> str:
    """What :func:`fedapp.models.clip.load_open_clip` loads for ``model_name``: the ``pretrained``
    value, or for ``pretrained = "reserve"`` the checkpoint pretrained on this run's reserve
    (:func:`fedapp.backbones.reserve_backbone`, made on first use)."""
    if config.pretrained.strip().lower() != RESERVE_BACKBONE:
        return config.pretrained
    return _reserve_weights(config, model_name)


@functools.lru_cache(maxsize=8)
def _reserve_weights(config: RunConfig, model_name: str) -> str:
    # Once per process: a worker builds a client per message, and the key digests every image.
    result = reserve_backbone(
        _load_cached(_source(config), "train"),
        model_name,
        reserve_pretrain=config.reserve_pretrain,
        reserve_test=config.reserve_test,
        reserve_seed=config.reserve_seed,
        cache_dir=resolve_cache_dir(config.cache_dir),
    )
    return str(result.checkpoint)


def shared_test_pool(config: RunConfig) -> tuple[ArrayDataset, str] | None:
    """The shared pool the clients draw their test sets from, and where it comes from:
    the ``reserve-test`` part of the source or ``test-data-dir``; None when each client
    tests on a split of its own data."""
    reserves = _reserves(config)
    if reserves and reserves[1]:
        return _reserved_cached(_source(config), *reserves, "test"), "the reserve-test part of the source"
    external = config.test_data_dir
    if external:
        return load_dataset(config, split="test", data_dir=external), f"test-data-dir {external!r}"
    return None


@functools.lru_cache(maxsize=2)
def _synthetic_cached(source: Source, count: int, seed: int) -> ArrayDataset:
    from fedapp.data.domains import synthetic_domains  # noqa: PLC0415 - only runs with synthetic domains need it

    return synthetic_domains(_load_cached(source, "train"), count, seed)


def partition(config: RunConfig, source: ArrayDataset, num_partitions: int) -> list[np.ndarray]:
    """The configured partition of ``source`` into ``num_partitions`` clients."""
    return partition_indices(
        source.labels,
        num_partitions,
        config.partition,
        alpha=config.alpha,
        classes_per_client=config.classes_per_client,
        class_assignment=config.class_assignment,
        shards_per_client=config.shards_per_client,
        seed=config.seed,
        cache_dir=resolve_cache_dir(config.cache_dir),
        domains=source.domains,
        clients_per_domain=config.clients_per_domain,
    )


@functools.lru_cache(maxsize=2)
def _partition_cached(config: RunConfig, num_partitions: int) -> tuple[np.ndarray, ...]:
    """Every client's indices, read-only, computed once per process and configuration: a worker
    serves many clients in turn, and partitioning checks, hashes and copies the whole label array."""
    parts = tuple(partition(config, load_dataset(config), num_partitions))
    for part in parts:
        part.setflags(write=False)
    return parts


def held_out_clients(config: RunConfig) -> frozenset[int]:
    """:func:`~fedapp.config.held_out_partitions` with the classes each partition holds, so that
    a ``covered`` draw keeps a training client for every class a held-out client holds. The
    server calls it (it has the data); clients need not know."""
    if not config.held_out_fraction:
        return held_out_partitions(config)
    source = load_dataset(config)
    parts = _partition_cached(config, config.num_partitions)
    return held_out_partitions(config, [np.unique(source.labels[part]).tolist() for part in parts])


def base_class_count(num_classes: int) -> int:
    """Classes ``0 .. B-1`` are base, the rest novel: the first half, rounded up (CoOp's split)."""
    return math.ceil(num_classes / 2)


def check_data(config: RunConfig, num_partitions: int) -> ArrayDataset:
    """Load and partition the source once, so bad data stops a run before training."""
    source = load_dataset(config)
    parts = partition(config, source, num_partitions)
    for pid, indices in enumerate(parts):
        if len(indices) == 0:
            raise DataError(
                f"partition {pid} of {num_partitions} has no samples; use fewer clients or another partition"
            )
    if config.base_to_novel:
        if source.num_classes < 2:
            raise DataError(f"base-to-novel needs at least 2 classes, the data has {source.num_classes}")
        base = base_class_count(source.num_classes)
        for pid, indices in enumerate(parts):
            if not np.any(source.labels[indices] < base):
                raise DataError(
                    f"base-to-novel: partition {pid} holds no sample of the {base} base classes, so it has nothing "
                    "to train on; use a partition that gives every client base classes (iid or dirichlet)"
                )
    if config.partition == "domain" and config.held_out_domain >= source.num_domains:
        raise DataError(
            f"held-out-domain = {config['held-out-domain']} is not a domain of the data "
            f"(0..{source.num_domains - 1}: {', '.join(source.domain_names)})"
        )
    pool = shared_test_pool(config)
    if pool is not None:
        _check_same_classes(source, *pool)
    return source


def _check_same_classes(train: ArrayDataset, test: ArrayDataset, where: str) -> None:
    if train.class_names != test.class_names:
        raise DataError(
            f"{where} has classes {list(test.class_names)[:5]}…, which differ from the "
            f"training data's {list(train.class_names)[:5]}…"
        )


def _subset(source: ArrayDataset, indices: np.ndarray) -> LabelledImages:
    return LabelledImages(images=source.images[indices], labels=source.labels[indices].astype(np.int64))


def few_shot(indices: np.ndarray, labels: np.ndarray, shots: int, seed: int) -> np.ndarray:
    """At most ``shots`` indices per class, drawn with ``seed`` (0 keeps all)."""
    if shots <= 0:
        return indices
    rng = np.random.default_rng(seed)
    kept = [rng.permutation(indices[labels[indices] == c])[:shots] for c in np.unique(labels[indices])]
    return np.sort(np.concatenate(kept)) if kept else indices


def load_client_data(config: RunConfig, partition_id: int, num_partitions: int, local_data_dir: str = "") -> ClientData:
    """Build client ``partition_id``'s splits.

    With ``local_data_dir`` (a SuperNode's own files) the client uses all of that
    data; otherwise it takes its partition of the configured source.
    """
    return _client_data_cached(config, partition_id, num_partitions, local_data_dir)


@functools.lru_cache(maxsize=32)
def _client_data_cached(config: RunConfig, partition_id: int, num_partitions: int, local_data_dir: str) -> ClientData:
    if not 0 <= partition_id < num_partitions:
        raise DataError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    seed = config.seed * 1_000_003 + partition_id
    if local_data_dir:
        source = load_dataset(config, data_dir=local_data_dir)
        indices = np.arange(len(source), dtype=np.int64)
    else:
        source = load_dataset(config)
        indices = _partition_cached(config, num_partitions)[partition_id]
    if len(indices) == 0:
        raise DataError(f"partition {partition_id} of {num_partitions} has no samples")
    train_share, val_share, test_share = parse_local_split(config.local_split)
    shared_test = shared_test_pool(config)
    if shared_test is not None:
        # With a shared test pool, the client's own data only feeds train and val.
        split = split_stratified(indices, source.labels, (train_share + test_share, val_share, 0.0), seed=seed)
        pool, where = shared_test
        _check_same_classes(source, pool, where)
        size = max(1, len(pool) // num_partitions)
        test_idx = sample_external_test(source.labels[split.train], pool.labels, size, seed=seed)
        test = _subset(pool, test_idx)
    else:
        split = split_stratified(indices, source.labels, (train_share, val_share, test_share), seed=seed)
        test = _subset(source, split.test)
    class_names, novel_names = source.class_names, ()
    train, val, novel_test = split.train, split.val, None
    if config.base_to_novel:
        # Training (and validation) sees base classes only; the test split is scored
        # on base and, separately, novel classes.
        base = base_class_count(source.num_classes)
        class_names, novel_names = source.class_names[:base], source.class_names[base:]
        train, val = (idx[source.labels[idx] < base] for idx in (train, val))
        if len(train) == 0:
            raise DataError(f"base-to-novel: partition {partition_id} has no training sample of a base class")
        is_base = test.labels < base
        novel_test = LabelledImages(images=test.images[~is_base], labels=test.labels[~is_base] - base)
        test = LabelledImages(images=test.images[is_base], labels=test.labels[is_base])
    train = few_shot(train, source.labels, config.shots_per_class, seed)
    splits = {"train": _subset(source, train), "val": _subset(source, val), "test": test}
    if novel_test is not None:
        splits["test_novel"] = novel_test
    return ClientData(partition_id=partition_id, splits=splits, class_names=class_names, novel_class_names=novel_names)
