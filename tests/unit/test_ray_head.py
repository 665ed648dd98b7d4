"""A sweep's shared Ray (fedapp.launch.ray_head): a cluster the user names is theirs, and nothing starts."""

from __future__ import annotations

import subprocess

import pytest

from fedapp.launch import ray_head


def test_a_cluster_the_user_names_is_joined_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a Ray head was started although RAY_ADDRESS names a cluster")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    env = {"FLWR_HOME": "/h", "RAY_ADDRESS": "10.0.0.1:6379"}
    with ray_head.shared_ray(env) as joined:
        assert joined == env
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # the sweep's own environment names it
    with ray_head.shared_ray({"FLWR_HOME": "/h"}) as joined:
        assert joined == {"FLWR_HOME": "/h"}


def test_a_head_that_prints_no_address_is_refused_in_one_line_with_what_it_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Silent:  # a head process that ended before printing its address
        pid = 0
        stdin = stdout = None

        def __init__(self, *args, stderr, **kwargs) -> None:
            stderr.write("ValueError: the object store cannot be placed\n")
            stderr.flush()
            self.stdout = type("Out", (), {"readline": staticmethod(lambda: "")})()
            self.stdin = type("In", (), {"close": staticmethod(lambda: None)})()

        def wait(self, timeout: float) -> int:
            return 1

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(subprocess, "Popen", Silent)
    refused = pytest.raises(ray_head.FedAppError, match=r"^Ray did not start .*object store cannot be placed$")
    with refused, ray_head.shared_ray({"FLWR_HOME": "/h"}, timeout=5):
        pass
