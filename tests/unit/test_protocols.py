"""Evaluation protocols for every method: domains, held-out clients and domains, base-to-novel, few-shot.

The per-method runs use :mod:`fedapp.inprocess` (the real strategies and
clients, without Flower's transport), so all nineteen methods go through each
protocol in seconds; one Ray simulation checks the same end to end.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedapp.catalog import CATALOG, MethodSpec
from fedapp.clientdata import load_client_data, load_dataset
from fedapp.config import MAX_SYNTHETIC_DOMAINS, METHODS, held_out_partitions, resolve_run_config
from fedapp.data import partition_indices
from fedapp.data.domains import SYNTHETIC_DOMAINS
from fedapp.errors import ConfigError, DataError
from fedapp.server_app import build_strategy


# Small settings per family, so each method's run takes seconds.
def protocol_settings(spec: MethodSpec) -> dict:
    """Small settings that run ``spec``'s method through a protocol in seconds, from its catalog facts."""
    if spec.backbone == "clip-text":
        return {"prompt-length": 2}
    if spec.backbone == "clip-vision":
        return {"clip-model": "fedapp-tiny-vit", "prompt-length": 2}
    if "fedd2p" in (spec.name, spec.variant_of):
        return {"client-models": "vgg-2,vgg-3", "d2p-steps": 3}
    if spec.mixed_models:
        return {"client-models": "cnn-4,cnn-5"}
    return {"model": "cnn-5"}


METHOD_SETTINGS = {name: protocol_settings(spec) for name, spec in CATALOG.items()}

# Three synthetic domains, two clients each; domain 2 (colour-shift) is left out, and
# a fifth of the clients is held out on top (the union never trains).
DOMAIN_PROTOCOL = {
    "partition": "domain",
    "synthetic-domains": 3,
    "clients-per-domain": 2,
    "num-partitions": 6,
    "held-out-domain": 2,
    "held-out-fraction": 0.2,
    "num-rounds": 2,
    "shots-per-class": 4,
    "batch-size": 16,
    "min-clients": 2,
}


def test_every_method_has_protocol_settings():
    assert set(METHOD_SETTINGS) == set(METHODS)
    for method, settings in METHOD_SETTINGS.items():
        resolve_run_config({"method": method, **DOMAIN_PROTOCOL, **settings})  # valid as they stand
    assert len(SYNTHETIC_DOMAINS) == MAX_SYNTHETIC_DOMAINS


# ----- the domain partition ------------------------------------------------------


def _domain_data(samples_per_domain: int = 120, domains: int = 3, classes: int = 5):
    rng = np.random.default_rng(7)
    labels = rng.integers(0, classes, size=samples_per_domain * domains)
    domain_ids = rng.permutation(np.repeat(np.arange(domains), samples_per_domain))
    return labels, domain_ids


def test_domain_partition_gives_each_client_exactly_one_domain():
    labels, domains = _domain_data()
    parts = partition_indices(labels, 3, "domain", domains=domains, clients_per_domain=1)
    for client, part in enumerate(parts):
        assert set(domains[part]) == {client}
        np.testing.assert_array_equal(part, np.flatnonzero(domains == client))


def test_domain_partition_splits_a_domain_among_its_clients_by_dirichlet():
    labels, domains = _domain_data()
    parts = partition_indices(labels, 6, "domain", domains=domains, clients_per_domain=2, alpha=0.3, seed=4)
    for domain in range(3):
        members = np.flatnonzero(domains == domain)
        own = parts[2 * domain : 2 * domain + 2]
        for part in own:
            assert set(domains[part]) == {domain}  # exactly one domain per client
        # Disjoint, covering the domain, and exactly the Dirichlet split of the domain's labels.
        np.testing.assert_array_equal(np.sort(np.concatenate(own)), members)
        within = partition_indices(labels[members], 2, "dirichlet", alpha=0.3, seed=4 + domain)
        for part, expected in zip(own, within, strict=True):
            np.testing.assert_array_equal(part, members[expected])
    # Skewed, not an even split: the two clients of a domain hold different label mixes.
    first, second = (np.bincount(labels[p], minlength=5) / len(p) for p in parts[:2])
    assert np.abs(first - second).sum() > 0.2


def test_domain_partition_refuses_a_wrong_client_count_and_missing_domains():
    labels, domains = _domain_data()
    with pytest.raises(DataError, match="needs num-partitions = 6, got 5"):
        partition_indices(labels, 5, "domain", domains=domains, clients_per_domain=2)
    with pytest.raises(DataError, match="needs a dataset with domains"):
        partition_indices(labels, 3, "domain")


def test_synthetic_domain_clients_hold_their_domain_transform_of_the_source(tmp_path):
    config = resolve_run_config(
        {"partition": "domain", "synthetic-domains": 3, "num-partitions": 3, "cache-dir": str(tmp_path)}
    )
    source = load_dataset(config)
    assert source.domain_names == SYNTHETIC_DOMAINS[:3]
    again = load_dataset(resolve_run_config({**config.as_dict()}))
    np.testing.assert_array_equal(source.images, again.images)  # deterministic
    for client in range(3):
        data = load_client_data(config, client, 3)
        # Every image a client holds comes from its own domain's samples.
        own = source.images[source.domains == client].reshape(-1, *source.images.shape[1:])
        own_rows = {image.tobytes() for image in own}
        assert all(image.tobytes() in own_rows for image in data.splits["train"].images)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"partition": "domain"}, "needs domains"),
        ({"partition": "domain", "synthetic-domains": 3, "num-partitions": 4}, "num-partitions must be 3"),
        ({"partition": "domain", "synthetic-domains": 2, "num-partitions": 2, "held-out-domain": 2}, "0..1"),
        ({"held-out-domain": 0}, "applies only to partition = domain"),
        ({"clients-per-domain": 2}, "applies only to partition = domain"),
        ({"synthetic-domains": 1}, "at least 2 domains"),
        ({"synthetic-domains": 7}, "must be <= 6"),
        ({"base-to-novel": True, "method": "fedavg"}, "cannot name classes it never saw"),
        (
            {"partition": "domain", "synthetic-domains": 2, "num-partitions": 2, "held-out-domain": 0},
            "leaving 1 to train, fewer than min-clients = 2",
        ),
    ],
)
def test_protocol_config_errors_name_the_problem(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run_config(overrides)


def test_held_out_partitions_join_the_held_out_domain_and_the_held_out_share():
    held = held_out_partitions(resolve_run_config(DOMAIN_PROTOCOL))
    assert {4, 5} <= held  # both clients of domain 2
    assert len(held - {4, 5}) <= 1  # round(0.2 * 6) = 1 more, possibly already in domain 2


# ----- every method through the domain and held-out protocols --------------------


# ----- base-to-novel ----------------------------------------------------------------


def test_base_to_novel_refuses_a_client_without_base_classes():
    config = resolve_run_config(
        {"method": "promptfl", "base-to-novel": True, "partition": "pathological", "classes-per-client": 1}
    )
    with pytest.raises(DataError, match="holds no sample of the 5 base classes"):
        build_strategy(config, record=False)


# ----- end to end through Flower's simulation ------------------------------------
