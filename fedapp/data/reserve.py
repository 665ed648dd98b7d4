"""Carve a source into pretraining, test and federated parts that never share an image.

A backbone pretrained on part of a dataset and then federated-tuned on the same
dataset is only honest if the federated clients never train or test on a
pretraining image, and if the clients' test images were seen by neither. The
carve is class-stratified and a function of ``(labels, fractions, seed)`` alone,
so the pretraining script (``benchmarks/pretrain_clip.py``) and every federated
run that sets the same ``reserve-*`` keys draw exactly the same parts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.data.arrays import ArrayDataset
from fedapp.data.splits import split_stratified
from fedapp.errors import DataError

__all__ = ["ReservedParts", "reserve_parts", "subset"]


@dataclass(frozen=True, eq=False)
class ReservedParts:
    """Disjoint sorted ``int64`` index arrays that together cover the source.

    Attributes
    ----------
    pretrain : np.ndarray
        Images kept for pretraining a backbone; federated runs never load them.
    test : np.ndarray
        Images neither pretraining nor any client trains on: the clients' test pool
        and the pretraining's zero-shot evaluation.
    federated : np.ndarray
        The rest: what the federated clients partition among themselves.
    """

    pretrain: np.ndarray
    test: np.ndarray
    federated: np.ndarray


def reserve_parts(labels: np.ndarray, *, pretrain: float, test: float, seed: int) -> ReservedParts:
    """Split ``range(len(labels))`` into pretrain / test / federated parts, per class.

    Parameters
    ----------
    labels : np.ndarray
        Class id of every image of the source.
    pretrain, test : float
        Shares of every class kept for pretraining and for testing, each in
        ``[0, 1)``, together below 1; per class the counts are rounded by largest
        remainder (ties favour pretraining, then test).
    seed : int
        Seed of the per-class shuffle. Independent of a run's ``seed``, so runs
        over several seeds share one carve and one pretrained backbone.

    Returns
    -------
    ReservedParts
        The three disjoint parts.

    Raises
    ------
    DataError
        If a share is out of range or nothing is left for the clients.
    """
    for name, share in (("pretrain", pretrain), ("test", test)):
        if not 0.0 <= share < 1.0:
            raise DataError(f"reserve-{name} = {share} must lie in [0, 1)")
    federated = 1.0 - pretrain - test
    if federated <= 0.0:
        raise DataError(f"reserve-pretrain + reserve-test = {pretrain + test:g} leaves no data for the clients")
    split = split_stratified(np.arange(len(labels)), labels, (pretrain, test, federated), seed=seed)
    return ReservedParts(pretrain=split.train, test=split.val, federated=split.test)


def subset(source: ArrayDataset, indices: np.ndarray) -> ArrayDataset:
    """The images of ``source`` at ``indices``, with its class and domain names."""
    domains = None if source.domains is None else source.domains[indices]
    return ArrayDataset(
        images=source.images[indices],
        labels=source.labels[indices],
        class_names=source.class_names,
        domains=domains,
        domain_names=source.domain_names,
    )
