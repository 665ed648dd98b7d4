"""Deployment on loopback: a real SuperLink, two SuperNodes and ``flwr run``.

The tier's one loopback federation serves FedAvg's run and one of each family's methods,
all submitted before the first test looks at one, as a long-lived deployment serves
several users' runs. They run on Flower's Message API (``api = message``). FedAvg runs two
rounds: the aggregate of round 1 comes back to the nodes and trains on in round 2. A
family's method runs one round, whose evaluate message already carries the round's
aggregate and finds the state its node kept from the fit message, each message in a
ClientApp process of its own: over real processes that is what a family adds (a second
round is the same two messages again; that one family's round 2 trains on from round 1's
exchange over real processes is checked by ``test_lean_supernode.py`` for FedD2P, and for
every method, round after round, on the in-process grid). pFedLoRA keeps its clients' local
models on disk (``state = "disk"``) and its run config names a state folder of its own:
the nodes write only where their node config says. A SuperNode works on one message at a
time, so every message here adds to the tier's time. The baselines' clients are their
family's client classes (``clients/text_prompt.py``, ``clients/visual_prompt.py``,
``clients/per_class.py``, ``clients/mutual.py``) with another exchange: that every
method gives the same records on both APIs is checked on an in-process grid and, one
method per family, in Ray simulations (``tests/integration/test_message_api_runs.py``);
the legacy API over real processes by ``test_docs_deployment.py`` (pFedLoRA across
separate hosts with TLS, as docs/deployment.md writes it), ``test_lean_supernode.py``
(FedD2P on lean SuperNodes; every CNN edge client from the lean install) and
``test_netns.py`` (FedAvg and Standalone through a rejoin and a SuperLink restart).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.federation import run_metrics

VIT = 'clip-model="fedapp-tiny-vit" prompt-length=2 shots-per-class=8'
D2P = 'client-models="vgg-2,vgg-3" d2p-steps=5 shots-per-class=8'

# FedAvg, and the method of each family (FedD2P's two variants and FedVPT-D run their parent's
# client unchanged; their server-side difference is checked in simulation).
CASES = {
    "fedavg": 'model="cnn-5"',
    # One of the two SuperNodes is held out: it answers for its partition, never trains, and is evaluated.
    "pep-fedpt": f"{VIT} held-out-fraction=0.5 min-clients=1",
    "fedd2p": D2P,
    "pfedlora": 'client-models="cnn-1,cnn-2" shots-per-class=8 state="disk"',
    "sdfed": 'shots-per-class=8 local-prompt-lengths="4,16"',
}
ROUNDS = {"fedavg": 2}
"""Rounds of a method's run: one unless named here."""


def submitted_state_dir(loopback) -> Path:
    """The state folder pFedLoRA's run config names: the nodes' own node config overrides it."""
    return loopback.root / "submitted" / "state"


@pytest.fixture(scope="module")
def runs(loopback):
    """Every method's run, in flight at once on the loopback federation."""
    results = loopback.root / "results"
    common = f'num-partitions=2 seed=5 results-dir="{results}"'
    extras = {**CASES, "pfedlora": f'{CASES["pfedlora"]} state-dir="{submitted_state_dir(loopback)}"'}
    return {
        method: loopback.submit(
            f'method="{method}" api="message" num-rounds={ROUNDS.get(method, 1)} {common} {extra} run-name="{method}"'
        )
        for method, extra in extras.items()
    }


@pytest.mark.parametrize("method", CASES)
def test_a_run_over_loopback(loopback, runs, method):
    rows = run_metrics(loopback.root / "results", method, runs[method].result(), loopback.processes)
    assert [r["round"] for r in rows] == list(range(1, ROUNDS.get(method, 1) + 1))
    if method == "pep-fedpt":
        assert all(r["clients_fit"] == 1 and r["clients_evaluated"] == 1 and r["held_out_clients"] == 1 for r in rows)
        return
    assert all(r["clients_fit"] == 2 and r["clients_evaluated"] == 2 for r in rows)
    if method == "fedavg":
        assert rows[-1]["acc_mean"] > 0.1  # better than chance on 10 classes after 2 rounds


def test_supernodes_write_only_under_their_own_node_config(loopback, runs):
    rows = run_metrics(loopback.root / "results", "pfedlora", runs["pfedlora"].result(), loopback.processes)
    assert rows[-1]["clients_fit"] == 2
    assert not submitted_state_dir(loopback).parent.exists(), "a SuperNode wrote where the submitted run config said"
    for pid in range(2):
        assert list((loopback.root / f"state-{pid}" / "pfedlora" / f"partition-{pid}").glob("*.safetensors"))
