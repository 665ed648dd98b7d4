"""Fixtures and tier markers shared by every tier.

The suite has three tiers, one folder each (``tests/unit``, ``tests/integration``,
``tests/system``); every test gets its folder's marker, so ``-m unit`` and
``tests/unit`` select the same tests. A fourth, ``tests/gpu``, runs on a machine with
a CUDA device only (``python -m pytest -q tests/gpu``; it is not in the default run,
and without CUDA it is one skipped line).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# One compute thread in this process and in every process it starts (SuperLinks, SuperNodes and
# their ClientApps, ServerApps, Ray workers, which already get one), set before torch is first
# imported. The suite's processes share the cores: two SuperNodes' ClientApps with a thread per
# core each oversubscribe 2 CPUs and spin on each other (the loopback deployment module took 320 s
# with torch's default threads, 246 s with one). The models are tiny: one thread loses nothing.
# A value in the environment is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
TIERS = ("unit", "integration", "system", "gpu")


# Modules whose tests use Flower's fixed local-SuperLink port (39091: a plain `flwr run`, or a
# stand-in listening there) run on one pytest-xdist worker, one after another.
FLOWER_DEFAULT_PORT = ("system/test_launch.py", "system/test_plugin_app.py", "system/test_sweep.py")
# Session-wide federations: every test that uses one runs on the worker that started it.
SHARED_FEDERATIONS = ("loopback", "netns")
# In-process modules long enough to unbalance the workers if they ran inside the integration group
# (the offline presets' full runs and their backbones' pretraining: about 11 minutes): a group each.
OWN_GROUP = ("integration/test_presets_accuracy.py",)


def xdist_group(item: pytest.Item, module: str) -> str:
    """The pytest-xdist group of a test (``--dist loadgroup``): its tier for the unit and integration
    tiers; in the system tier its module's, unless it shares a machine-wide resource with other
    modules. A module stays whole on one worker, so its module-scoped fixtures are paid once."""
    for federation in SHARED_FEDERATIONS:
        if federation in getattr(item, "fixturenames", ()):
            return f"federation-{federation}"
    tier = module.split("/", maxsplit=1)[0]
    if module in OWN_GROUP:
        return module
    if tier in ("unit", "integration"):
        # CPU-bound (training, Ray simulations sharing one Ray start): one worker each, beside the
        # system tier's modules, which mostly wait on processes they started.
        return tier
    return "flower-default-port" if module in FLOWER_DEFAULT_PORT else module


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(item.path).resolve().relative_to(TESTS).parts
        tier = parts[0] if len(parts) > 1 else ""
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in one of tests/{', tests/'.join(TIERS)}")
        item.add_marker(getattr(pytest.mark, tier))
        item.add_marker(pytest.mark.xdist_group(xdist_group(item, "/".join(parts))))


def random_order_line(config: pytest.Config) -> str | None:
    """The line that replays this run's order (pytest-randomly's seed), or None when the order is the files'."""
    seed = getattr(config.option, "randomly_seed", None)
    if not config.pluginmanager.has_plugin("randomly") or not isinstance(seed, int):
        return None
    return f"random order: --randomly-seed={seed} replays it"


ORDER_FOLDER = "test-order"
"""Under pytest's cache folder: the tests each process ran, in order (``gw0.txt``, ``gw1.txt`` under
pytest-xdist, ``main.txt`` in one process), one node id a line, so that
``python -m pytest --randomly-seed=N --randomly-dont-reorganize @<file>`` runs one worker's tests again,
in its order, in one process: the seed fixes each group's order, not which worker took which group."""
_ORDER_FILE = pytest.StashKey[object]()


def order_file(config: pytest.Config) -> Path | None:
    """Where this process writes the tests it runs; None in pytest-xdist's controller (it runs none)
    and without pytest's cache."""
    cache = getattr(config, "cache", None)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if cache is None or (worker is None and getattr(config.option, "numprocesses", None)):
        return None
    return cache.mkdir(ORDER_FOLDER) / f"{worker or 'main'}.txt"


def plain_node_id(item: pytest.Item) -> str:
    """The node id a command line takes: without the ``@group`` pytest-xdist adds under ``--dist loadgroup``."""
    group = item.get_closest_marker("xdist_group")
    suffix = f"@{group.args[0]}" if group and group.args else None
    return item.nodeid.removesuffix(suffix) if suffix else item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The seed before the first test, in every verbosity (``-q`` hides the header), so that a run
    that dies (a crashed interpreter prints no summary) can still be replayed; and the file of the
    tests this process runs (:data:`ORDER_FOLDER`)."""
    line = random_order_line(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line)
    path = order_file(session.config)
    if path is not None:
        session.config.stash[_ORDER_FILE] = path.open("w", buffering=1)  # a line a test: a crash keeps it


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The seed again beside the results, in every verbosity (``-q`` hides the header)."""
    line = random_order_line(config)
    if line:
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a pytest-xdist worker whose groups did not take: tests that share a federation or
    Flower's fixed port would then run side by side and fail in ways that hide the cause."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
    if ungrouped:
        why = (
            f"pytest-xdist did not group {ungrouped[0]} (and {len(ungrouped) - 1} more): this pytest keeps "
            "node ids where pytest-xdist cannot mark the group; install the pytest that pyproject.toml pins"
        )
        print(why, file=sys.stderr)  # a worker's exception reaches the terminal only as xdist's own assertion
        raise pytest.UsageError(why)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    order = item.config.stash.get(_ORDER_FILE, None)
    if order is not None:
        order.write(plain_node_id(item) + "\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    order = session.config.stash.get(_ORDER_FILE, None)
    if order is not None:
        order.close()


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """A private cache dir, so tests never write to the user's home.

    Session-wide and in ``os.environ`` before any worker starts: Ray workers and
    Flower processes inherit the environment they were started with.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDAPP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fedapp-cache"))
        yield os.environ["FEDAPP_CACHE_DIR"]


def _logger_states() -> dict[str, tuple]:
    """Every logger's filters, handlers, level, propagation and switch, by name ("" is the root)."""
    loggers = {"": logging.getLogger()}
    every = logging.Logger.manager.loggerDict.items()
    loggers.update((name, logger) for name, logger in every if isinstance(logger, logging.Logger))
    return {
        name: (logger, list(logger.filters), list(logger.handlers), logger.level, logger.propagate, logger.disabled)
        for name, logger in loggers.items()
    }


def _restore_loggers(saved: dict[str, tuple]) -> None:
    for logger, filters, handlers, level, propagate, disabled in saved.values():
        logger.filters[:], logger.handlers[:] = filters, handlers
        logger.propagate, logger.disabled = propagate, disabled
        if logger.level != level:
            logger.setLevel(level)  # (clears the loggers' cached levels too)
    for name, logger in logging.Logger.manager.loggerDict.items():
        if name not in saved and isinstance(logger, logging.Logger):
            logger.filters.clear()  # a logger made during the test keeps nothing the test put on it
            logger.handlers.clear()


@pytest.fixture(scope="session", autouse=True)
def _ray_leaves_visible_devices_alone() -> Iterator[None]:
    """Ray's coming behaviour, in every simulation the suite starts: a worker given no GPU keeps the
    visible devices it inherited (our ClientApp then picks the CPU itself), and Ray 2.x's
    FutureWarning about the change is not printed (the launcher sets the same)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        yield


def _restore_environ(saved: dict[str, str]) -> None:
    """Put back only the variables a test changed: every ``setenv``/``unsetenv`` may move the C
    environment under threads that read it (Ray's, gRPC's in this process), so none is redone
    needlessly."""
    for name in [name for name in os.environ if name not in saved]:
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _process_state_as_found() -> Iterator[None]:
    """What a test may change in this process, given back as the test found it, so that no test
    depends on which tests ran before it (the suite runs in a random order: pytest-randomly).

    The environment (Flower's Ray backend writes the driver's ``sys.path`` into ``PYTHONPATH``
    when a simulation runs in this process, and processes that later tests start would inherit
    it), ``sys.path``, the working directory, every logger's filters, handlers and level (our
    ServerApp puts a filter on Flower's logger once per process), the colours of Flower's console
    handler and torch's thread count.
    """
    from flwr.common.logger import console_handler  # noqa: PLC0415 - Flower is imported by every tier

    environ, path, cwd = dict(os.environ), list(sys.path), os.getcwd()
    loggers, colored = _logger_states(), console_handler.colored
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    _restore_environ(environ)
    sys.path[:] = path
    if os.getcwd() != cwd:
        os.chdir(cwd)
    _restore_loggers(loggers)
    console_handler.colored = colored
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


CHECKOUT_OUTPUTS = ("results", "state")
"""The run config's default ``results-dir`` and ``state-dir``, folders relative to the working directory."""


def _entries(folder: Path) -> set[str]:
    return set(os.listdir(folder)) if folder.is_dir() else set()


@pytest.fixture(autouse=True)
def _nothing_written_into_the_checkout() -> Iterator[None]:
    """A test's runs write under the test's own folders: a run config without ``results-dir``, run
    from the checkout, puts a run folder into its ``results/`` (a unit test's strategy did, and held
    the folder's lock open to the end of the session)."""
    checkout = TESTS.parent
    before = {name: _entries(checkout / name) for name in CHECKOUT_OUTPUTS}
    yield
    for name, entries in before.items():
        written = sorted(_entries(checkout / name) - entries)
        assert not written, f"the test wrote {written[:3]} into the checkout's {name}/"


@pytest.fixture(scope="session")
def clip():
    """The tiny random-init open_clip model (loaded once; no network)."""
    from fedapp.models import TINY_CLIP, load_open_clip  # noqa: PLC0415 - only tests that use it pay the import

    return load_open_clip(TINY_CLIP)


@pytest.fixture
def task_identity() -> Iterator[None]:
    """Messages are stamped with the run of the process (Flower sets it in a ServerApp's)."""
    from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415 - only the Message API tests need it

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@pytest.fixture(scope="session")
def ray_kept_running(_private_cache):
    """One Ray start for a whole tier of simulations.

    Flower's Ray backend starts Ray when it is not running and shuts it down at the end of
    every simulation (``RayBackend.terminate``). With ``ray.shutdown`` held off until the
    session ends, the first start serves every simulation that asks for the same resources;
    each still gets fresh actors (Flower kills its actor pool at the end of a run).
    """
    import ray  # noqa: PLC0415 - only the tiers with simulations need it

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray, "shutdown", lambda *args, **kwargs: None)
        yield
    ray.shutdown()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for small runs: as fast, and two threads on CPUs that other jobs share
    wait on each other (a 3-second run took two minutes)."""
    import torch  # noqa: PLC0415

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
