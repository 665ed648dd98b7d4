"""The per-node index of a simulation's undelivered messages answers as Flower's own
``InMemoryLinkState.get_message_ins`` does (fedapp/flower/pending_index.py)."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedapp.flower.pending_index import PendingIndex, index_pending_messages
from tests.paths import load_script

poll_script = load_script("simulation_poll")


@pytest.fixture(autouse=True)
def server_task(monkeypatch):
    """The task a simulation's ServerApp runs as (the grid stamps its messages with it)."""
    for name, value in (("_task_id", 1), ("_run_id", poll_script.RUN_ID), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def twin_grids(num_nodes: int = 6):
    """Two identical simulation grids: the first keeps Flower's ``get_message_ins``, the second is indexed."""
    flower, nodes = poll_script.simulation_grid(num_nodes)
    indexed, twin_nodes = poll_script.simulation_grid(num_nodes)
    assert index_pending_messages(indexed)
    return flower, indexed, list(nodes), list(twin_nodes)


def push(grid, nodes, plan: list[tuple[int, str]]) -> None:
    """One message per ``(node index, tag)``, in that order; the tag travels in the config."""
    grid.push_messages(
        [
            Message(RecordDict({"config": ConfigRecord({"tag": tag})}), dst_node_id=nodes[i], message_type="train")
            for i, tag in plan
        ]
    )


def asked(grid, nodes, node_index: int, limit: int | None = 1, run_id: int | None = None) -> list[str]:
    messages = grid.state.get_message_ins(node_id=nodes[node_index], limit=limit, run_id=run_id)
    assert all(m.metadata.delivered_at != "" for m in messages)  # both mark what they hand out
    return [m.content.config_records["config"]["tag"] for m in messages]


def test_the_index_hands_out_what_flowers_own_does_in_the_same_order():
    flower, indexed, nodes, twin = twin_grids()
    plan = [(0, "a1"), (1, "b1"), (0, "a2"), (2, "c1"), (0, "a3"), (3, "d1")]
    push(flower, nodes, plan)
    push(indexed, twin, plan)
    polls = [(0, 1), (1, 1), (0, None), (4, 1), (2, 2), (0, 1), (3, None), (1, 1)]
    answers = [(asked(flower, nodes, i, limit), asked(indexed, twin, i, limit)) for i, limit in polls]
    assert [ours for _, ours in answers] == [flowers for flowers, _ in answers]
    assert [ours for _, ours in answers] == [["a1"], ["b1"], ["a2", "a3"], [], ["c1"], [], ["d1"], []]
    # Messages stored later (the next batch of a round) are found, including for a node served before.
    push(flower, nodes, [(1, "b2"), (5, "f1")])
    push(indexed, twin, [(1, "b2"), (5, "f1")])
    assert [asked(indexed, twin, i) for i in (5, 1)] == [asked(flower, nodes, i) for i in (5, 1)] == [["f1"], ["b2"]]


def test_a_pulled_reply_deletes_its_message_and_the_next_one_for_the_node_is_found():
    _, indexed, _, nodes = twin_grids()
    push(indexed, nodes, [(0, "first")])
    (message,) = indexed.state.get_message_ins(node_id=nodes[0], limit=1)
    indexed.state.delete_messages({message.metadata.message_id})  # what the grid does once it pulled the reply
    assert indexed.state.message_ins_store == {}
    push(indexed, nodes, [(0, "second")])
    assert asked(indexed, nodes, 0) == ["second"]


def test_an_expired_message_is_deleted_and_not_handed_out_as_flowers_own_does():
    flower, indexed, nodes, twin = twin_grids()
    for grid, ids in ((flower, nodes), (indexed, twin)):
        push(grid, ids, [(0, "stale"), (0, "fresh")])
        stale = next(iter(grid.state.message_ins_store.values()))
        stale.metadata.__dict__["_created_at"] -= stale.metadata.ttl + 1
        assert asked(grid, ids, 0) == ["fresh"]
        assert len(grid.state.message_ins_store) == 1


def test_a_message_of_another_run_waits_and_a_bad_limit_is_refused_as_by_flower():
    flower, indexed, nodes, twin = twin_grids()
    push(flower, nodes, [(0, "a")])
    push(indexed, twin, [(0, "a")])
    other_run = poll_script.RUN_ID + 1
    assert asked(indexed, twin, 0, run_id=other_run) == asked(flower, nodes, 0, run_id=other_run) == []
    run = poll_script.RUN_ID
    assert asked(indexed, twin, 0, run_id=run) == asked(flower, nodes, 0, run_id=run) == ["a"]
    for grid, ids in ((flower, nodes), (indexed, twin)):
        with pytest.raises(AssertionError, match="`limit` must be >= 1"):
            grid.state.get_message_ins(node_id=ids[0], limit=0)


def test_only_a_simulations_grid_is_indexed_and_only_once():
    grid, _ = poll_script.simulation_grid(3)
    assert index_pending_messages(grid) and index_pending_messages(grid)
    assert isinstance(grid.state.get_message_ins, PendingIndex)
    assert not index_pending_messages(object())


def test_a_state_without_the_internals_it_reads_keeps_flowers_own_scan():
    grid, _ = poll_script.simulation_grid(3)
    del grid.state.message_ins_store  # as in a Flower release that renamed it
    assert not index_pending_messages(grid)
    assert not isinstance(grid.state.get_message_ins, PendingIndex)
