"""fedapp.flower.sampling on its own: the draw depends on (seed, round, salt) and partitions,
never on node ids; held-out partitions never train; each node is asked its partition once,
except in Flower's simulation, whose registration order gives the partitions."""

from __future__ import annotations

import logging

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common import Code, Error, GetPropertiesRes, MessageTypeLegacy, Status
from flwr.compat.common import recorddict_compat
from flwr.server import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.superlink.grid import InMemoryGrid

from fedapp.config import resolve_run_config
from fedapp.flower.driver import PartitionProxy
from fedapp.flower.message_api import NodeProxy
from fedapp.flower.sampling import PROPERTIES, ClientSampler, registered_partitions
from tests.paths import load_script


class CountingProxy(PartitionProxy):
    """A node that counts how often it is asked its partition."""

    def __init__(self, partition: int, cid: str | None = None) -> None:
        super().__init__(partition, cid)
        self.asked = 0

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        return super().get_properties(ins, timeout, group_id)


class SilentProxy(CountingProxy):
    """A node that cannot say its partition."""

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        raise ConnectionError("node lost")


def manager_of(proxies) -> SimpleClientManager:
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    return manager


def config(**overrides):
    return resolve_run_config({"num-partitions": 10, "min-clients": 2, **overrides})


def partitions(proxies) -> list[int]:
    return [proxy.partition for proxy in proxies]


def test_the_draw_depends_on_seed_round_and_partitions_not_on_node_ids():
    cfg = config(**{"fraction-fit": 0.3})
    first = ClientSampler(cfg).sample(3, manager_of([PartitionProxy(p, f"a{p}") for p in range(10)]), 0.3, salt=0)
    # The same partitions behind other node ids, registered in another order.
    others = manager_of([PartitionProxy(p, f"z{9 - p}") for p in reversed(range(10))])
    second = ClientSampler(cfg).sample(3, others, 0.3, salt=0)
    assert len(first) == 3  # ceil(0.3 * 10)
    assert partitions(first) == partitions(second)
    assert partitions(first) == sorted(partitions(first))  # in partition order
    draws = {tuple(partitions(ClientSampler(cfg).sample(r, others, 0.3, salt=0))) for r in range(1, 9)}
    assert len(draws) > 1  # another round, another draw
    other_seed = ClientSampler(config(seed=5))
    assert {tuple(partitions(other_seed.sample(r, others, 0.3, salt=0))) for r in range(1, 9)} != draws


def test_the_salt_separates_the_fit_draw_from_the_evaluate_draw():
    manager = manager_of([PartitionProxy(p) for p in range(10)])
    sampler = ClientSampler(config())
    fit = [tuple(partitions(sampler.sample(r, manager, 0.3, salt=0))) for r in range(1, 9)]
    evaluate = [tuple(partitions(sampler.sample(r, manager, 0.3, salt=1))) for r in range(1, 9)]
    assert fit != evaluate


def test_at_least_min_clients_are_picked_and_everyone_at_fraction_one():
    manager = manager_of([PartitionProxy(p) for p in range(10)])
    sampler = ClientSampler(config(**{"min-clients": 4}))
    assert len(sampler.sample(1, manager, 0.1, salt=0)) == 4
    assert partitions(sampler.sample(1, manager, 1.0, salt=0)) == list(range(10))


def test_full_participation_without_held_out_clients_asks_no_node():
    proxies = [CountingProxy(p) for p in range(4)]
    chosen = ClientSampler(config(**{"num-partitions": 4})).sample(1, manager_of(proxies), 1.0, salt=0)
    assert len(chosen) == 4
    assert [proxy.asked for proxy in proxies] == [0, 0, 0, 0]


def test_each_node_is_asked_its_partition_once():
    proxies = [CountingProxy(p) for p in range(10)]
    sampler = ClientSampler(config())
    manager = manager_of(proxies)
    for server_round in range(1, 4):
        sampler.sample(server_round, manager, 0.5, salt=0)
    assert [proxy.asked for proxy in proxies] == [1] * 10
    assert sampler.partition_of == {proxy.cid: proxy.partition for proxy in proxies}


def test_a_node_that_cannot_say_its_partition_is_left_out_and_asked_again(caplog):
    silent = SilentProxy(9, "silent")
    proxies = [*(PartitionProxy(p) for p in range(9)), silent]
    sampler = ClientSampler(config())
    manager = manager_of(proxies)
    with caplog.at_level(logging.WARNING, logger="flwr.fedapp"):
        first = sampler.sample(1, manager, 0.99, salt=0)
    assert silent not in first and len(first) == 9  # ceil(0.99 * 9 answering nodes)
    assert "round 1: client silent did not report its partition" in caplog.text
    assert sampler.partition(silent, 2) is None
    assert silent.asked == 2 and "silent" not in sampler.partition_of


def test_held_out_partitions_never_train_and_are_evaluated_only_when_included():
    cfg = config(**{"held-out-fraction": 0.2})
    sampler = ClientSampler(cfg)
    assert len(sampler.held_out) == 2
    manager = manager_of([PartitionProxy(p) for p in range(10)])
    for server_round in range(1, 6):
        fit = partitions(sampler.sample(server_round, manager, 1.0, salt=0))
        assert sorted(set(fit) | sampler.held_out) == list(range(10)) and not set(fit) & sampler.held_out
    assert not set(partitions(sampler.sample(1, manager, 1.0, salt=1))) & sampler.held_out
    assert partitions(sampler.sample(1, manager, 1.0, salt=1, include_held_out=True)) == list(range(10))


def test_replies_of_held_out_clients_are_split_off_in_order():
    sampler = ClientSampler(config(**{"held-out-fraction": 0.2}))
    proxies = [PartitionProxy(p) for p in range(10)]
    sampler.ask_partitions(proxies, 1)
    unknown = PartitionProxy(0, "never-asked")
    replies = [(proxy, f"reply {proxy.partition}") for proxy in [*reversed(proxies), unknown]]
    kept, held = sampler.split_held_out(replies)
    assert [p.partition for p, _ in held] == sorted(sampler.held_out, reverse=True)
    assert [r for _, r in kept] == [r for p, r in replies if p.partition not in sampler.held_out or p is unknown]
    assert all(sampler.is_held_out(p.cid) for p, _ in held)
    assert not sampler.is_held_out("never-asked")  # unknown partition: not held out


@pytest.mark.parametrize(("partition", "domain"), [(0, 0), (1, 0), (2, 1), (5, 2)])
def test_domain_of_a_node_follows_its_partition(partition, domain):
    cfg = resolve_run_config(
        {"partition": "domain", "synthetic-domains": 3, "clients-per-domain": 2, "num-partitions": 6}
    )
    sampler = ClientSampler(cfg)
    proxy = PartitionProxy(partition)
    assert sampler.domain_of(proxy.cid) is None  # not asked yet
    sampler.ask_partitions([proxy], 1)
    assert sampler.domain_of(proxy.cid) == domain


def test_without_domains_no_node_has_one():
    sampler = ClientSampler(config())
    proxy = PartitionProxy(3)
    sampler.ask_partitions([proxy], 1)
    assert sampler.domain_of(proxy.cid) is None


class RecordingGrid:
    """A grid whose node ``100 + p`` holds partition p; it records every ``send_and_receive``.
    ``silent`` nodes never reply, ``failing`` ones reply with an error."""

    def __init__(self, silent=(), failing=()) -> None:
        self.silent, self.failing = set(silent), set(failing)
        self.batches: list[list[int]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.batches.append([m.metadata.dst_node_id for m in messages])
        replies = []
        for message in messages:
            node = message.metadata.dst_node_id
            if node in self.silent:
                continue
            if node in self.failing:
                replies.append(Message(Error(code=0, reason="node crashed"), reply_to=message))
                continue
            properties = {"partition-id": node - 100}
            if message.metadata.message_type == MessageTypeLegacy.GET_PROPERTIES:
                res = GetPropertiesRes(Status(Code.OK, ""), properties)
                content = recorddict_compat.getpropertiesres_to_recorddict(res)
            else:
                content = RecordDict({PROPERTIES: ConfigRecord(properties)})
            replies.append(Message(content, reply_to=message))
        return replies


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize(
    "proxy_of",
    [lambda node, grid: GridClientProxy(node, grid, run_id=1), NodeProxy],
    ids=["legacy-grid-proxy", "message-api-node-proxy"],
)
def test_a_grids_nodes_are_asked_their_partition_in_one_batch(proxy_of, caplog):
    """One push of every query and one wait for the replies, not one poll interval per node
    (issue: a start that does not grow with N); nodes that fail or stay silent are left out."""
    grid = RecordingGrid(silent={110}, failing={111})
    proxies = [proxy_of(100 + p, grid) for p in range(12)]
    sampler = ClientSampler(config(**{"num-partitions": 12}))
    with caplog.at_level(logging.WARNING, logger="flwr.fedapp"):
        chosen = sampler.sample(1, manager_of(proxies), 0.5, salt=0)
    assert grid.batches == [[proxy.node_id for proxy in proxies]]
    assert sampler.partition_of == {str(100 + p): p for p in range(10)}
    assert len(chosen) == 5 and {proxy.node_id for proxy in chosen} <= set(range(100, 110))
    assert "round 1: client 110 did not report its partition (TimeoutError('no reply'))" in caplog.text
    assert "round 1: client 111 did not report its partition (RuntimeError('node crashed'))" in caplog.text
    sampler.sample(2, manager_of(proxies), 0.5, salt=0)
    assert grid.batches[1] == [110, 111]  # only the nodes that did not answer are asked again


# The engine's own node registration on the grid a simulation's ServerApp gets.
simulation_grid = load_script("simulation_poll").simulation_grid


class CountingSimulationGrid(InMemoryGrid):
    """An in-memory grid that counts the messages pushed through it."""

    pushed = 0

    def send_and_receive(self, messages, *, timeout=None):
        CountingSimulationGrid.pushed += len(list(messages))
        return []


@pytest.mark.usefixtures("task_identity")
def test_a_simulations_nodes_are_not_asked_their_partition_their_registration_order_says_it():
    """Flower's engine gives the i-th node it registers partition i (issue 25: asking 10,000
    simulated nodes cost O(N²) in Flower's runtime)."""
    grid, nodes_mapping = simulation_grid(40, CountingSimulationGrid)
    assert registered_partitions(grid) == nodes_mapping
    proxies = [GridClientProxy(node, grid, run_id=7) for node in grid.get_node_ids()]
    sampler = ClientSampler(config(**{"num-partitions": 40, "held-out-fraction": 0.25}))
    chosen = sampler.sample(1, manager_of(proxies), 0.25, salt=0)
    assert CountingSimulationGrid.pushed == 0
    assert sampler.partition_of == {str(node): partition for node, partition in nodes_mapping.items()}
    assert not {sampler.partition_of[proxy.cid] for proxy in chosen} & sampler.held_out


def test_a_grid_that_is_not_a_simulations_is_asked():
    assert registered_partitions(RecordingGrid()) is None


def test_a_reply_that_contradicts_the_registration_order_turns_the_inference_off(caplog):
    sampler = ClientSampler(config())
    sampler.partition_of = {"1": 0, "2": 1}
    proxies = [PartitionProxy(0, "1"), PartitionProxy(1, "2")]
    agreeing = [(proxies[0], GetPropertiesRes(Status(Code.OK, ""), {}))]  # no metrics: nothing to check
    sampler.confirm(agreeing)
    assert sampler.trust_registration
    reply = type("Reply", (), {"metrics": {"partition_id": 5}})()
    with caplog.at_level(logging.ERROR, logger="flwr.fedapp"):
        sampler.split_held_out([(proxies[1], reply)])
    assert not sampler.trust_registration
    assert sampler.partition_of == {"2": 5}
    assert "client 2 reports partition 5, not 1 as the server had it" in caplog.text
