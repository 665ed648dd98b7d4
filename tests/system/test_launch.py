"""The README's default path: ``flwr run`` on a local SuperLink, through fedapp.launch."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

import fedapp.launch.federation as launch_federation
from fedapp.config import METHODS, SCHEMA
from fedapp.inprocess import run_in_process
from fedapp.launch import run, stop_processes, superlink_pids
from fedapp.launch.processes import home_pids
from fedapp.metrics import read_metrics
from fedapp.models import MODEL_NAMES
from tests.paths import ROOT, takes_ctrl_c


class _HealthyHandler(http.server.BaseHTTPRequestHandler):
    """Answers like a healthy SuperLink that accepts no runs."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_temporary_flower_home_is_removed_even_when_the_run_fails(tmp_path, monkeypatch):
    made = tmp_path / "made-by-launch"

    def mkdtemp(prefix=""):
        made.mkdir()
        return str(made)

    def failing_flwr_run(command, **kwargs):
        assert Path(command[0]).name == "flwr"
        assert (Path(kwargs["env"]["FLWR_HOME"]) / "config.toml").exists()  # the connection file is in the home
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(launch_federation.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(launch_federation, "stream_command", failing_flwr_run)
    with pytest.raises(subprocess.CalledProcessError):
        run({"num-rounds": 1, "results-dir": str(tmp_path / "results")}, num_clients=2)
    assert not made.exists()
    # A home the caller names is the caller's: it stays.
    given = tmp_path / "given"
    with pytest.raises(subprocess.CalledProcessError):
        run({"num-rounds": 1, "results-dir": str(tmp_path / "results")}, num_clients=2, flwr_home=given)
    assert (given / "config.toml").exists()


@contextlib.contextmanager
def running_launcher(tmp_path: Path, stderr=subprocess.DEVNULL) -> Iterator[tuple[subprocess.Popen, Path]]:
    """A launcher of a long run, its SuperLink started, in its own Flower home; whatever the test
    does to it, nothing of that home is left running afterwards."""
    home = (tmp_path / "home").resolve()
    config = f'num-rounds=100 results-dir="{tmp_path / "results"}"'
    launcher = subprocess.Popen(
        [sys.executable, "-m", "fedapp.launch", "--flwr-home", str(home), "--num-clients", "2", "--run-config", config],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        preexec_fn=takes_ctrl_c,  # noqa: PLW1509 - one signal disposition, set before exec
    )
    try:
        deadline = time.monotonic() + 120
        while not superlink_pids(home) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert superlink_pids(home), "the launcher never started its SuperLink"
        yield launcher, home
    finally:
        launcher.kill()
        stop_processes(superlink_pids(home) + home_pids(home))


def test_sigterm_to_the_launcher_stops_its_superlink(tmp_path):
    with running_launcher(tmp_path) as (launcher, home):
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 128 + signal.SIGTERM
        assert superlink_pids(home) == []


def test_ctrl_c_ends_the_launcher_with_one_line_and_no_process_left(tmp_path):
    """Issue 42: Ctrl-C during a launch printed a 20-line KeyboardInterrupt traceback."""
    with running_launcher(tmp_path, stderr=subprocess.PIPE) as (launcher, home):
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode == 128 + signal.SIGINT, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert err.strip().splitlines()[-1].startswith("error: interrupted; the run folder keeps the rounds")
        assert superlink_pids(home) == []


def test_sigkill_to_the_launcher_leaves_no_flower_process_behind(tmp_path):
    """Issue 42: ``kill -9`` of the launcher left its ``flower-superlink --insecure`` and
    ``flower-superexec`` running (an unauthenticated SuperLink nobody owns). Its sentinel,
    in a session of its own, sees the launcher's end and stops every process of its home."""
    with running_launcher(tmp_path) as (launcher, home):
        time.sleep(3)  # the SuperExec and the simulation start under it
        assert len(home_pids(home)) >= 2, "expected the SuperLink and the processes under it"
        launcher.send_signal(signal.SIGKILL)
        assert launcher.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 60
        while home_pids(home) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert home_pids(home) == [] and superlink_pids(home) == []
        assert home.is_dir()  # a home the user gave is kept


def launch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m fedapp.launch ARGS`` as a user types it, in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "fedapp.launch", *args],
        check=False, capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip


ROUND_LINE = re.compile(r"\bround (\d+)/2 \| acc mean ")


@pytest.fixture
def impostor_superlink() -> Iterator[None]:
    """Something already answers on Flower's default local SuperLink port (another user's or another
    launch's SuperLink): a launch must use its own."""
    try:
        impostor = http.server.HTTPServer(("127.0.0.1", 39091), _HealthyHandler)
    except OSError:  # the port is taken by a real one already: the same situation
        yield
        return
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    yield
    impostor.shutdown()


def test_a_launch_completes_stops_its_superlink_and_its_log_in_a_pipe_is_plain(tmp_path, impostor_superlink):
    """What a user, a CI job or a log file gets from ``python -m fedapp.launch`` without a terminal,
    with another SuperLink on Flower's default port: the run completes on its own SuperLink, which
    is stopped at the end; no escape codes, one round line per round with its ETA, the run's done
    line naming the results folder, and none of the lines that are false for a launched run or that
    repeat the metrics; no Flower "DEPRECATED FEATURE" warning about an API the app uses. Keys of
    other methods, which FedAvg does not read (issue 63), are named in one warning line. It runs from
    a folder with a ``strategies.py`` and a ``clients/`` of the user's, which ours never reach."""
    results, home = tmp_path / "results", (tmp_path / "home").resolve()
    run_config = f'num-rounds=2 num-partitions=2 model="cnn-5" shots-per-class=10 results-dir="{results}"'
    run_config += " proto-weight=2.0 sdfed-lambda=0.3"
    # Launched from a user's app folder with a strategies.py and a clients/ of its own (issue 64).
    (tmp_path / "strategies.py").write_text("raise ImportError('the user strategies.py was imported')\n")
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "__init__.py").write_text("raise ImportError('the user clients/ was imported')\n")
    proc = launch("--flwr-home", str(home), "--num-clients", "2", "--run-config", run_config, cwd=tmp_path, timeout=300)
    seen = proc.stdout + proc.stderr
    assert proc.returncode == 0, seen[-3000:]
    assert superlink_pids(home) == []
    assert "DEPRECATED" not in seen, seen[-3000:]
    assert "\x1b" not in seen
    rounds = [line for line in seen.splitlines() if ROUND_LINE.search(line)]
    assert [ROUND_LINE.search(line)[1] for line in rounds] == ["1", "2"], seen[-3000:]
    assert all(re.search(r"\| elapsed \S+ \| ETA \S+$", line) for line in rounds), rounds
    assert rounds[-1].endswith("| ETA 0s")
    (run_dir,) = results.iterdir()
    assert [r["clients_fit"] for r in read_metrics(run_dir / "metrics.jsonl")] == [2, 2]
    done = [line for line in seen.splitlines() if "done: round 2/2 | final acc mean " in line]
    assert len(done) == 1 and done[0].endswith(f"| results in {run_dir}"), seen[-3000:]
    assert proc.stdout.splitlines()[-1] == f"results: {run_dir}"
    for noise in ("changed from 10 to 2", "FutureWarning", "History (loss", "[ROUND", "configure_fit", "Traceback"):
        assert noise not in seen, noise
    device_lines = [line for line in seen.splitlines() if "device = " in line]
    assert len(device_lines) <= 1, device_lines  # each worker's same line, shown once
    unread = "warning: fedavg does not read sdfed-lambda (read by sdfed), proto-weight (read by fedproto)"
    assert [line for line in seen.splitlines() if unread in line] != [], seen[-3000:]
    assert sum(unread in line for line in seen.splitlines()) == 1


USER_CONFIG_TOML = '[superlink]\ndefault = "lab"\n\n[superlink.lab]\naddress = "lab.example.org:9093"\n'
RUN_NAME_LINE = (
    "error: config key 'run-name' = {!r} must be a single folder name (no '/', '\\', '..' or surrounding "
    "spaces): runs are written to results-dir/<run-name>"
)
# (id, --run-config, the one line the user sees)
LAUNCHER_ERRORS = [
    ("run name climbing out", 'run-name="../escaped"', RUN_NAME_LINE.format("../escaped")),
    ("absolute run name", 'run-name="/tmp/escaped-absolute"', RUN_NAME_LINE.format("/tmp/escaped-absolute")),
    (
        "unquoted string",
        "method=sdfed",
        "error: --run-config item method=sdfed: sdfed is not a number, true/false or a quoted string: "
        'quote a string, method="sdfed"',
    ),
    (
        "item without '='",
        "num-rounds=1 verbose",
        "error: --run-config item 'verbose' is not key=value (quote values with spaces: key=\"a b\")",
    ),
    ("zero clients", "num-partitions=0", "error: config key 'num-partitions' = 0 must be >= 1"),
    (  # issue 63: refused after 37 s with 5000 simulated SuperNodes up; now before Flower starts
        "more clients than samples",
        "num-partitions=5000",
        "error: num_partitions must be between 1 and the number of samples (1797), got 5000",
    ),
    ("unknown key", "no-such-key=1", f"error: unknown config key(s): no-such-key; valid keys: {', '.join(SCHEMA)}"),
    ("wrong type", 'num-rounds="ten"', "error: config key 'num-rounds' = 'ten' has type str, expected int"),
    ("flag of the wrong type", 'traceback="yes"', "error: config key 'traceback' = 'yes' has type str, expected bool"),
    ("out of range", "lr=0", "error: config key 'lr' = 0.0 must be > 0.0"),
    (
        "unknown method",
        'method="fedsgd"',
        f"error: config key 'method' = 'fedsgd' is not one of: {', '.join(METHODS)}",
    ),
    (
        "unknown model",
        'model="resnet-9000"',
        f"error: config key 'model' = 'resnet-9000' is not one of: {', '.join(MODEL_NAMES)}",
    ),
    (
        "missing preset",
        'preset="conf/none.yaml"',
        "error: config key 'preset' = 'conf/none.yaml': file not found (looked in "
        f"[PosixPath('conf/none.yaml'), PosixPath('{ROOT}/conf/none.yaml')])",
    ),
    (
        "missing data folder",
        'dataset="imagefolder" data-dir="/no/such/folder"',
        "error: config key 'data-dir' = '/no/such/folder': path does not exist",
    ),
    (
        "more min-clients than clients",
        "min-clients=20",
        "error: config key 'min-clients' = 20 is more than 'num-partitions' = 10",
    ),
    (
        "more classes per client than classes",
        'partition="pathological" classes-per-client=11',
        "error: config key 'classes-per-client' = 11 is more than the 10 classes of dataset 'digits'",
    ),
    (
        "robust rule with secure aggregation",
        'aggregation="median" secagg=true',
        "error: config key 'aggregation' = 'median' needs each client's update, but secagg = true shows the server "
        "only their sum: use one of them",
    ),
    (
        "resume of a run that never ran",
        'resume=true run-name="never-ran"',
        "error: resume=true, but run folder {work}/results/never-ran does not exist: nothing to resume",
    ),
    (
        "results folder that cannot be written",
        'results-dir="/proc/fedapp-results"',
        "error: config key 'results-dir' = '/proc/fedapp-results' cannot be written (No such file or directory): "
        "choose a folder you can write",
    ),
    (
        "cache folder that cannot be written",
        'cache-dir="/etc/hostname/cache"',
        "error: config key 'cache-dir' = '/etc/hostname/cache' cannot be written (Not a directory): "
        "choose a folder you can write",
    ),
    (
        "global and local prompts longer than the text context as one sequence (the default)",
        'method="sdfed" local-prompt-lengths="4,24"',
        "error: config keys 'prompt-length' = 8 and 'local-prompt-lengths' = '4,24' with sdfed-combination = "
        "'sequence' gives client 1 a prompt of 32 tokens, but 'fedapp-tiny-clip' reads 32 text tokens (start, "
        "prompt, class name, end): use at most 29, or a model with a longer context (ViT-B-16: 77)",
    ),
]


@pytest.mark.parametrize(("run_config", "line"), [r[1:] for r in LAUNCHER_ERRORS], ids=[r[0] for r in LAUNCHER_ERRORS])
def test_bad_launcher_input_is_one_line_and_writes_nothing(tmp_path, run_config, line):
    """Through the user's entry point: one 'error:' line, exit 2, nothing written anywhere."""
    work = tmp_path / "work"
    work.mkdir()
    # A case that names its own results-dir gives it once (a key given twice is refused, issue 63).
    given = run_config if "results-dir=" in run_config else f'results-dir="{work / "results"}" {run_config}'
    proc = launch("--flwr-home", str(work / "home"), "--run-config", given, cwd=work)
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [line.replace("{work}", str(work))])
    assert list(work.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert not Path("/tmp/escaped-absolute").exists()


def test_the_launcher_never_rewrites_a_flower_home_it_did_not_make(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(USER_CONFIG_TOML)
    proc = launch("--flwr-home", str(home), "--run-config", "num-rounds=1", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --flwr-home {home} already holds a Flower config.toml of its own; give a new or empty folder "
        "(the launcher writes its local connection there), or leave --flwr-home out"
    ]
    assert (home / "config.toml").read_text() == USER_CONFIG_TOML and sorted(p.name for p in home.iterdir()) == [
        "config.toml"
    ]


def test_the_launcher_refuses_to_run_over_a_finished_run(tmp_path):
    """A second launch under the same run name is refused at once, and the first run's files stay as they were."""
    folder = tmp_path / "results" / "exp1"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"round": 1}\n')
    (folder / "config.yaml").write_text("lr: 0.5\n")
    proc = launch("--run-config", f'results-dir="{tmp_path / "results"}" run-name="exp1" num-rounds=1', cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: run folder {folder} already holds a run (metrics.jsonl): set resume=true to continue it, "
        "or choose another run-name (results are never overwritten)"
    ]
    assert (folder / "config.yaml").read_text() == "lr: 0.5\n" and len(list(folder.iterdir())) == 2


def test_a_second_launch_into_a_folder_another_run_is_writing_exits_non_zero(tmp_path):
    """Issue 42: the second launch logged that the folder "is being written by another run", then
    printed ``results: ...`` and exited 0 (the first run's summary appeared while it waited)."""
    base = f'results-dir="{tmp_path / "results"}" run-name="same" num-rounds=4 num-partitions=2'
    first = subprocess.Popen(
        [sys.executable, "-m", "fedapp.launch", "--num-clients", "2", "--run-config", base],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    try:
        lock = tmp_path / "results" / "same" / ".lock"
        deadline = time.monotonic() + 120
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lock.exists(), "the first run never took its folder"
        second = launch("--num-clients", "2", "--run-config", base, cwd=tmp_path, timeout=300)
        assert first.wait(timeout=300) == 0
    finally:
        first.kill()
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    last = second.stderr.strip().splitlines()[-1]
    assert "is being written by another run" in last or "already holds a run" in last, last
    assert "results:" not in second.stdout


def test_a_run_in_which_no_client_trained_ends_non_zero_with_the_reason(tmp_path, monkeypatch):
    """Every client fails every round (each message fails, as FEDAPP_FAULT_RATE=1 makes it): the
    launcher says so, exit 2."""
    monkeypatch.setenv("FEDAPP_FAULT_RATE", "1")
    run_config = (
        f'results-dir="{tmp_path / "results"}" run-name="untrained" num-rounds=1 num-partitions=2 '
        'method="standalone" model="cnn-5"'
    )
    proc = launch("--run-config", run_config, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no client trained in any of the 1 rounds of untrained (left out: ")
    assert last.endswith("its metrics are of the untrained model; see the clients' errors in the log")
    # Each client's failure is one line with its own message; no traceback anywhere.
    assert "left out a client that failed: injected fault (FEDAPP_FAULT_RATE=1 on node" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_an_unwritable_state_dir_is_refused_before_round_1(tmp_path):
    """Issue 42: a state-dir the clients could not write was found only after round 1, leaving a run
    folder with NaN metrics; now it is probed up front, as results-dir and cache-dir are."""
    run_config = (
        f'results-dir="{tmp_path / "results"}" run-name="stateless" num-rounds=1 num-partitions=2 '
        'method="standalone" model="cnn-5" state="disk" state-dir="/proc/fedapp-unwritable"'
    )
    proc = launch("--run-config", run_config, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("error: config key 'state-dir' = '/proc/fedapp-unwritable' cannot be written (")
    )
    assert not (tmp_path / "results" / "stateless").exists()


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (exported models included) but its lock, by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def test_a_tampered_checkpoint_is_refused_in_one_line_and_the_run_folder_kept(tmp_path):
    """A finished run's checkpoint gets a NaN; resuming it through the launcher is refused by the
    ServerApp with one line, and the folder stays byte for byte as it was."""
    results, folder = tmp_path / "results", tmp_path / "results" / "tampered"
    settings = {"run-name": "tampered", "num-partitions": 2, "model": "cnn-5", "shots-per-class": 10}
    # The finished run, written in this process (the launcher's resume below is what is checked).
    run_in_process({**settings, "results-dir": str(results), "num-rounds": 1}, record=True)
    base = f'results-dir="{results}" run-name="tampered" num-partitions=2 model="cnn-5" shots-per-class=10'
    with np.load(folder / "checkpoint.npz", allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["global/0"] = np.full_like(arrays["global/0"], np.nan)
    np.savez(folder / "checkpoint.npz", **arrays)
    before = folder_bytes(folder)
    proc = launch("--run-config", f"{base} num-rounds=2 resume=true", cwd=tmp_path, timeout=300)
    seen = proc.stdout + proc.stderr
    assert proc.returncode == 2
    error = f"error: checkpoint {folder / 'checkpoint.npz'}: array global/0 holds NaN or infinite values"
    assert any(line.endswith(error) for line in seen.splitlines()), seen[-3000:]
    assert "Traceback" not in seen
    assert folder_bytes(folder) == before


@pytest.fixture(scope="module")
def plain_home(tmp_path_factory) -> Iterator[Path]:
    """A fresh Flower home for ``flwr run`` as docs/getting-started.md shows it (a local simulation): the
    module's plain runs share the local SuperLink that the first one starts (as a user's second
    ``flwr run`` does), stopped by PID at the end."""
    home = tmp_path_factory.mktemp("plain") / "home"
    yield home
    stop_processes(superlink_pids(home))


def plain_flwr_run(home: Path, run_config: str, cwd: Path) -> str:
    """``flwr run`` of this app in ``home``, from ``cwd``. Returns what the user saw."""
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    federation = "num-supernodes=2 client-resources-num-cpus=1"
    command = ["flwr", "run", str(ROOT), "--stream", "--federation-config", federation, "--run-config", run_config]
    proc = subprocess.run(
        [str(Path(sys.executable).parent / command[0]), *command[1:]],
        check=False, capture_output=True, text=True, timeout=300, cwd=cwd, env=env,
    )  # fmt: skip
    return proc.stdout + proc.stderr


def test_plain_flwr_run_shows_a_serverapp_error_as_one_line(tmp_path, plain_home):
    seen = plain_flwr_run(plain_home, f'results-dir="{tmp_path / "results"}" lr=0', tmp_path)
    assert any(line.endswith("error: config key 'lr' = 0.0 must be > 0.0") for line in seen.splitlines()), seen[-3000:]
    assert "Traceback" not in seen and "Exit Code" not in seen, seen[-3000:]
    assert not (tmp_path / "results").exists()


def test_plain_flwr_run_shows_tracebacks_when_asked(tmp_path, plain_home):
    seen = plain_flwr_run(plain_home, "lr=0 traceback=true", tmp_path)
    assert "Traceback (most recent call last)" in seen and "ConfigError: config key 'lr' = 0.0" in seen


ROBUST_COMMAND = re.compile(r"^python -m fedapp\.launch --run-config 'aggregation=.*$", re.MULTILINE)


def test_the_readme_robust_aggregation_command_runs_as_written(tmp_path):
    """The command in docs/reliability.md, verbatim, in a fresh folder: three Multi-Krum rounds of ten clients."""
    (line,) = ROBUST_COMMAND.findall((ROOT / "docs" / "reliability.md").read_text())
    command = [sys.executable, *shlex.split(line)[1:]]  # this environment's python
    proc = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "results").iterdir()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["aggregation"] == "multi-krum"
    assert [r["clients_fit"] for r in read_metrics(run_dir / "metrics.jsonl")] == [10, 10, 10]


def test_plain_flwr_run_with_a_misspelt_key_gets_flower_s_refusal_that_the_docs_explain(tmp_path, plain_home):
    """Flower checks the keys against pyproject.toml before any code of ours runs, so it, not we, answers
    a misspelt key; docs/configuration.md quotes its words and names the command that names the key."""
    seen = plain_flwr_run(plain_home, f'results-dir="{tmp_path / "results"}" num-round=2', tmp_path)
    assert "Invalid run configuration" in seen, seen[-3000:]
    assert not (tmp_path / "results").exists()
    docs = (ROOT / "docs" / "configuration.md").read_text()
    assert "`[code: 15] Invalid run configuration.`" in docs
    assert "the same `--run-config` given to `python -m fedapp.launch` names it" in docs
