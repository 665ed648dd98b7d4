"""docker/: the images lint clean and agree, compose is consistent, the credential scripts work.

Nothing here needs a Docker engine or the network: Dockerfiles go through
hadolint, the shell scripts through shellcheck (both are dev dependencies), the
compose files are checked as data, and the scripts are run into ``tmp_path``.
The install steps of the images (which torch index, which extras) run under
``sh`` with a stand-in ``pip``/``python3`` that records its arguments, and the
documented ``docker run`` of one device is parsed and checked against
``docker/Dockerfile.supernode`` and the compose ``supernode`` profile.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from flwr.common.config import parse_config_args

from fedapp.config import RunConfig, resolve_run_config
from fedapp.extras import (
    FLWR_DATASETS,
    HF_DATASETS,
    MATPLOTLIB,
    OPEN_CLIP,
    SCIKIT_LEARN,
    client_requirements,
)
from tests.paths import ROOT

DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
GENERAL_DOCKERFILES = (DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda")
SUPERNODE_DOCKERFILE = DOCKER / "Dockerfile.supernode"
DOCKER_DOCS = ROOT / "docs" / "docker.md"
MULTI_ARCH_BUILD = (
    "docker buildx build --platform linux/amd64,linux/arm64 -f docker/Dockerfile.supernode -t fedapp-supernode:latest ."
)
SCRIPTS = sorted(DOCKER.glob("*.sh"))
BASE_COMPOSE = DOCKER / "compose.yaml"
OVERRIDES = sorted(p for p in DOCKER.glob("compose*.yaml") if p != BASE_COMPOSE)
MAKE_CERTS = DOCKER / "make-certs.sh"
MAKE_NODE_KEYS = DOCKER / "make-node-keys.sh"

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
needs_ssh_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed")


def dev_tool(name: str) -> str:
    """A linter installed by the dev extra (the venv's own copy first)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is a dev dependency (pip install -e '.[dev]')"
    return found


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, timeout=120, **kwargs)


# --- Dockerfiles --------------------------------------------------------------------------------


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, comments dropped and continuation lines joined."""
    result, pending = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        result.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, f"{dockerfile.name} ends in a continuation line"
    return result


def env_keys(args: str) -> list[str]:
    return [word.split("=", 1)[0] for word in shlex.split(args)]


def env_values(dockerfile: Path) -> dict[str, str]:
    values = {}
    for keyword, args in instructions(dockerfile):
        if keyword == "ENV":
            values.update(word.split("=", 1) for word in shlex.split(args))
    return values


def shared_layout(dockerfile: Path) -> list[tuple[str, str]]:
    """The instructions every image variant must share: ARG defaults and NVIDIA_* variables may differ."""
    layout = []
    for keyword, args in instructions(dockerfile):
        if keyword == "ARG":
            args = args.split("=", 1)[0]
        elif keyword == "ENV" and all(key.startswith("NVIDIA_") for key in env_keys(args)):
            continue
        layout.append((keyword, args))
    return layout


def build_args(dockerfile: Path) -> dict[str, str | None]:
    """Every ``ARG`` with its default (``None`` when it has none)."""
    found: dict[str, str | None] = {}
    for keyword, args in instructions(dockerfile):
        if keyword == "ARG":
            name, eq, default = args.partition("=")
            found[name] = default if eq else None
    return found


def test_dockerfiles_are_found():
    assert {p.name for p in DOCKERFILES} >= {"Dockerfile", "Dockerfile.cuda", "Dockerfile.supernode"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    done = run([dev_tool("hadolint"), "--failure-threshold", "warning", dockerfile])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_contract(dockerfile):
    steps = instructions(dockerfile)
    args = dict(a.split("=", 1) for k, a in steps if k == "ARG" and "=" in a)
    base = next(a for k, a in steps if k == "FROM")
    if base.startswith("${"):
        base = args[base.strip("${}")]
    tag = base.partition(":")[2]
    assert tag and tag != "latest" and any(c.isdigit() for c in tag), f"base image {base} is not pinned"
    env = env_values(dockerfile)
    assert env.get("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION") == "1"
    users = [a for k, a in steps if k == "USER"]
    assert users, "the image must not run as root"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert args.get(user.strip("${}"), user) not in {"root", "0"}
    volumes = next(a for k, a in steps if k == "VOLUME")
    assert "/data" in volumes and "/state" in volumes
    assert steps[-1] == ("ENTRYPOINT", '["flower-supernode"]')


def test_cuda_image_differs_only_in_torch_wheels_and_nvidia_variables():
    cpu, cuda = DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"
    assert shared_layout(cuda) == shared_layout(cpu)
    env = env_values(cuda)
    assert env.get("NVIDIA_VISIBLE_DEVICES") and env.get("NVIDIA_DRIVER_CAPABILITIES")
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert not any(key.startswith("NVIDIA_") for key in env_values(cpu))
    index = {p.name: dict(a.split("=", 1) for k, a in instructions(p) if k == "ARG" and "=" in a) for p in (cpu, cuda)}
    assert "whl/cpu" in index["Dockerfile"]["TORCH_INDEX_URL"]
    assert "cpu" not in index["Dockerfile.cuda"]["TORCH_INDEX_URL"]


# --- the install steps, run with stand-ins ------------------------------------------------------


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extras_closure(extra: str) -> set[str]:
    """``extra`` and the extras it pulls in through ``fedapp[...]`` (``server`` = ``clip``, ``data`` and more)."""
    optional = pyproject()["project"]["optional-dependencies"]
    found, todo = set(), [extra]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for requirement in optional[name]:
            self_ref = re.fullmatch(r"fedapp\[([\w,\s-]+)\]", requirement)
            if self_ref:
                todo.extend(e.strip() for e in self_ref.group(1).split(","))
    return found


def run_step(dockerfile: Path, marker: str, tmp_path: Path, **overrides: str) -> tuple[int, str, list[list[str]]]:
    """Run the one ``RUN`` of ``dockerfile`` containing ``marker`` under ``sh`` in ``tmp_path``.

    The ``ARG`` defaults (with ``overrides``) are its environment, as in a build; ``pip``,
    ``pip3`` and ``python3`` are stand-ins that record their arguments and succeed (``sed``
    and the shell are real, so an edit of ``pyproject.toml`` shows in ``tmp_path``); ``/tmp/``
    is moved under ``tmp_path``. Returns the exit status, stderr and the recorded calls.
    """
    (step,) = [a for k, a in instructions(dockerfile) if k == "RUN" and marker in a]
    bin_dir, scratch = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    scratch.mkdir()
    log = tmp_path / "calls.log"
    standin = (
        '#!/bin/sh\n{ printf "%s" "${0##*/}"; for a in "$@"; do printf "\\t%s" "$a"; done; echo; } >> "$STANDIN_LOG"\n'
    )
    for tool in ("pip", "pip3", "python3"):
        (bin_dir / tool).write_text(standin)
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "STANDIN_LOG": str(log), "HOME": str(tmp_path)}
    env.update({name: default or "" for name, default in build_args(dockerfile).items()})
    env.update(overrides)
    done = subprocess.run(
        ["sh", "-c", step.replace("/tmp/", f"{scratch}/")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    calls = [line.split("\t") for line in log.read_text().splitlines()] if log.exists() else []
    return done.returncode, done.stderr, calls


def pip_installs(calls: list[list[str]]) -> list[list[str]]:
    """The arguments after ``install`` of every ``pip install`` / ``python3 -m pip install`` call."""
    found = []
    for call in calls:
        words = call[3:] if call[:3] == ["python3", "-m", "pip"] else call[1:] if call[0] in ("pip", "pip3") else []
        if words[:1] == ["install"]:
            found.append(words[1:])
    return found


def project_spec(install: list[str]) -> str:
    """The local project argument of a pip install (``./``, ``./[server]``)."""
    (spec,) = [word for word in install if word.startswith(".")]
    return spec


def copy_project_metadata(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)


def torch_pins() -> dict[str, str]:
    pins = {}
    for requirement in pyproject()["project"]["dependencies"]:
        name, eq, version = requirement.partition("==")
        if eq and name in ("torch", "torchvision"):
            pins[name] = version
    assert set(pins) == {"torch", "torchvision"}, "the base install pins torch and torchvision"
    return pins


TORCH_STEP = "torch==${TORCH_VERSION}"
PROJECT_STEP = "uninstall --yes fedapp"


@pytest.mark.parametrize(
    ("arch", "index_arg"),
    [("amd64", "TORCH_INDEX_URL_AMD64"), ("arm64", "TORCH_INDEX_URL_ARM64")],
)
def test_supernode_image_installs_torch_from_its_architectures_index(tmp_path, arch, index_arg):
    args = build_args(SUPERNODE_DOCKERFILE)
    assert "TARGETARCH" in args and args["TARGETARCH"] is None, "TARGETARCH must be BuildKit's, not a default"
    assert "download.pytorch.org/whl/cpu" in args["TORCH_INDEX_URL_AMD64"]
    assert args["TORCH_INDEX_URL_ARM64"] == "https://pypi.org/simple", "PyPI's aarch64 wheels are the CPU builds"
    assert args["INSTALL_TORCH"] == "true"
    pins = torch_pins()
    assert (args["TORCH_VERSION"], args["TORCHVISION_VERSION"]) == (pins["torch"], pins["torchvision"])
    rc, err, calls = run_step(SUPERNODE_DOCKERFILE, TORCH_STEP, tmp_path, TARGETARCH=arch)
    assert rc == 0, err
    (install,) = pip_installs(calls)
    assert install[install.index("--index-url") + 1] == args[index_arg]
    assert f"torch=={pins['torch']}" in install and f"torchvision=={pins['torchvision']}" in install


def test_supernode_image_without_buildkit_asks_the_machine(tmp_path):
    machine = {"x86_64": "TORCH_INDEX_URL_AMD64", "aarch64": "TORCH_INDEX_URL_ARM64"}.get(os.uname().machine)
    if machine is None:
        pytest.skip(f"no torch index for {os.uname().machine}")
    rc, err, calls = run_step(SUPERNODE_DOCKERFILE, TORCH_STEP, tmp_path, TARGETARCH="")
    assert rc == 0, err
    (install,) = pip_installs(calls)
    assert install[install.index("--index-url") + 1] == build_args(SUPERNODE_DOCKERFILE)[machine]


def test_supernode_image_refuses_an_architecture_it_has_no_torch_for(tmp_path):
    rc, err, calls = run_step(SUPERNODE_DOCKERFILE, TORCH_STEP, tmp_path, TARGETARCH="riscv64")
    assert rc != 0
    assert "riscv64" in err
    assert pip_installs(calls) == []


def test_supernode_image_installs_the_lean_profile_unless_extras_are_asked_for(tmp_path):
    assert build_args(SUPERNODE_DOCKERFILE)["EXTRAS"] == "", "the default must be the lean install"
    copy_project_metadata(tmp_path)
    rc, err, calls = run_step(SUPERNODE_DOCKERFILE, PROJECT_STEP, tmp_path)
    assert rc == 0, err
    installs = pip_installs(calls)
    assert [project_spec(i) for i in installs] == ["./"], installs
    assert not any("[" in word for install in installs for word in install), "no extra by default"
    assert (tmp_path / "pyproject.toml").read_text() == (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("extras", ["clip", "clip,data"])
def test_supernode_image_adds_the_extras_of_its_build_argument(tmp_path, extras):
    copy_project_metadata(tmp_path)
    rc, err, calls = run_step(SUPERNODE_DOCKERFILE, PROJECT_STEP, tmp_path, EXTRAS=extras)
    assert rc == 0, err
    assert [project_spec(i) for i in pip_installs(calls)] == [f"./[{extras}]"]
    assert set(extras.split(",")) <= set(pyproject()["project"]["optional-dependencies"])


def test_supernode_image_keeps_the_base_images_torch_for_jetson(tmp_path):
    rc, err, calls = run_step(SUPERNODE_DOCKERFILE, TORCH_STEP, tmp_path, TARGETARCH="arm64", INSTALL_TORCH="false")
    assert rc == 0, err
    assert pip_installs(calls) == [], "INSTALL_TORCH=false must not install torch"
    assert any(call[:2] == ["python3", "-c"] and "import torch" in call[2] for call in calls), "nor go without it"


def test_supernode_image_for_jetson_drops_the_torch_pins_and_holds_the_base_versions(tmp_path):
    copy_project_metadata(tmp_path)
    rc, err, calls = run_step(SUPERNODE_DOCKERFILE, PROJECT_STEP, tmp_path, INSTALL_TORCH="false")
    assert rc == 0, err
    kept = tomllib.loads((tmp_path / "pyproject.toml").read_text())["project"]["dependencies"]
    original = pyproject()["project"]["dependencies"]
    assert [d for d in original if not d.startswith(("torch==", "torchvision=="))] == kept
    (install,) = pip_installs(calls)
    assert project_spec(install) == "./"
    assert "--constraint" in install, "the base image's torch, torchvision and numpy must be held"
    (hold,) = [c for c in calls if c[:2] == ["python3", "-c"]]
    assert all(name in hold[2] for name in ("'torch'", "'torchvision'", "'numpy'")), hold


@pytest.mark.parametrize("dockerfile", GENERAL_DOCKERFILES, ids=lambda p: p.name)
def test_general_images_install_what_the_serverapp_needs(tmp_path, dockerfile):
    """The SuperLink runs its ServerApp in this image: the default profile must cover every extra
    the server can ask for except the trackers (FEDAPP_EXTRAS=server,tracking adds those)."""
    default = build_args(dockerfile)["FEDAPP_EXTRAS"]
    assert default == "server"
    copy_project_metadata(tmp_path)
    rc, err, calls = run_step(dockerfile, PROJECT_STEP, tmp_path)
    assert rc == 0, err
    assert [project_spec(i) for i in pip_installs(calls)] == [f"./[{default}]"]
    server_side = {r.extra for r in (OPEN_CLIP, SCIKIT_LEARN, FLWR_DATASETS, HF_DATASETS, MATPLOTLIB)}
    assert server_side <= extras_closure(default), server_side - extras_closure(default)


def test_supernode_image_runs_one_node_unprivileged_with_data_and_state_volumes():
    steps = instructions(SUPERNODE_DOCKERFILE)
    args = build_args(SUPERNODE_DOCKERFILE)
    env = env_values(SUPERNODE_DOCKERFILE)
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["FEDAPP_CACHE_DIR"].startswith("/state/"), "the data cache belongs on the state volume"
    (volumes,) = [a for k, a in steps if k == "VOLUME"]
    assert sorted(yaml.safe_load(volumes)) == ["/data", "/state"]
    (user,) = [a for k, a in steps if k == "USER"]
    uid_arg = re.fullmatch(r"\$\{(\w+)\}:\$\{(\w+)\}", user)
    assert uid_arg, f"USER {user} should name the build's uid and gid"
    assert args[uid_arg.group(1)] not in (None, "", "0") and args[uid_arg.group(2)] not in (None, "", "0")
    assert any(k == "RUN" and "useradd" in a and f"${{{uid_arg.group(1)}}}" in a for k, a in steps)
    assert steps[-1] == ("ENTRYPOINT", '["flower-supernode"]')
    assert not any(k == "EXPOSE" for k, _ in steps), "a SuperNode only dials out"
    header = SUPERNODE_DOCKERFILE.read_text()
    assert MULTI_ARCH_BUILD in header and "INSTALL_TORCH=false" in header and "l4t-pytorch" in header


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "the matcher below does not handle exceptions"
    return patterns


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` (relative to the context) out: it or a parent folder matches."""
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        for pattern in patterns:
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], pattern[3:]):
                return True
    return False


def test_dockerignore_keeps_what_the_images_copy_and_drops_secrets():
    patterns = dockerignore_patterns()
    copied = {src for p in DOCKERFILES for k, a in instructions(p) if k == "COPY" for src in a.split()[:-1]}
    assert copied >= {"pyproject.toml", "fedapp"}
    for src in sorted(copied):
        assert (ROOT / src).exists(), f"COPY {src}: no such path"
        assert not dockerignored(src, patterns), f".dockerignore leaves out {src}, which an image copies"
    for excluded in (".git", ".venv", "results", ".pytest_cache", "fedapp/__pycache__", "docker/credentials/keys/n"):
        assert dockerignored(excluded, patterns), f".dockerignore should leave out {excluded}"


# --- compose -------------------------------------------------------------------------------------


def deep_merge(base: dict, override: dict) -> dict:
    """Compose's merge of an override file, for mappings (all these files override)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def compose_configs() -> list:
    base = load_yaml(BASE_COMPOSE)
    configs = [pytest.param(base, id="compose.yaml")]
    for override in OVERRIDES:
        configs.append(pytest.param(deep_merge(base, load_yaml(override)), id=f"compose.yaml+{override.name}"))
    return configs


def options(command: list[str]) -> dict[str, str | None]:
    """``--name value``, ``--name=value`` and bare ``--flag`` of a command list."""
    found: dict[str, str | None] = {}
    i = 0
    while i < len(command):
        word = str(command[i])
        assert word.startswith("--"), f"unexpected argument {word!r} in {command}"
        name, eq, value = word.partition("=")
        if not eq and i + 1 < len(command) and not str(command[i + 1]).startswith("--"):
            value, i = str(command[i + 1]), i + 1
        found[name] = value if (eq or value) else None
        i += 1
    return found


def mounts(service: dict) -> list[dict]:
    result = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
            volume = {"type": kind, "source": source, "target": target, "read_only": mode == ["ro"]}
        result.append(volume)
    return result


def mount_at(service: dict, target: str) -> dict:
    found = [m for m in mounts(service) if m["target"] == target]
    assert len(found) == 1, f"expected one mount at {target}, got {found}"
    return found[0]


def default_services(config: dict) -> dict[str, dict]:
    """The services a plain ``docker compose up`` starts: those in no profile."""
    return {name: s for name, s in config["services"].items() if not s.get("profiles")}


def supernodes(config: dict) -> dict[str, dict]:
    """The SuperNodes a plain ``up`` starts (the ``supernode`` profile's device node is checked apart)."""
    services = default_services(config).items()
    return {name: s for name, s in services if "--superlink" in options(s.get("command", []))}


@pytest.mark.parametrize("config", compose_configs())
def test_compose_builds_from_existing_dockerfiles(config):
    for name, service in config["services"].items():
        build = service.get("build")
        assert build, f"{name} has no build section"
        context = (DOCKER / build["context"]).resolve()
        assert context == ROOT, f"{name}: the build context must be the repo root (where .dockerignore is)"
        assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']} does not exist"
        assert service.get("restart") == "unless-stopped", name


@pytest.mark.parametrize("path", [BASE_COMPOSE, *OVERRIDES, *DOCKERFILES], ids=lambda p: p.name)
def test_nothing_runs_insecure(path):
    assert "insecure" not in path.read_text().lower()


@pytest.mark.parametrize("config", compose_configs())
def test_compose_superlink_serves_tls_with_node_auth_and_a_persistent_database(config):
    link = config["services"]["superlink"]
    assert link["entrypoint"] == ["flower-superlink"]
    opts = options(link["command"])
    assert "--enable-supernode-auth" in opts
    assert opts.get("--host") == "0.0.0.0"
    tls = {"--ssl-ca-certfile": "ca.crt", "--ssl-certfile": "server.pem", "--ssl-keyfile": "server.key"}
    for flag, name in tls.items():
        mount = mount_at(link, opts[flag])
        assert mount["type"] == "bind" and mount["read_only"] is True, flag
        assert mount["source"] == f"./credentials/certs/{name}", flag
    database = Path(opts["--database"])
    state = mount_at(link, str(database.parent))
    assert state["type"] == "volume", "the SuperLink database must live on a named volume"
    published = [str(p).rsplit(":", 1)[-1] for p in link.get("ports", [])]
    assert opts["--port"] in published


@pytest.mark.parametrize("config", compose_configs())
def test_compose_supernodes_are_distinct_authenticated_and_stateful(config):
    link_port = options(config["services"]["superlink"]["command"])["--port"]
    nodes = supernodes(config)
    assert len(nodes) >= 2
    partitions, sizes, keys, states, data = [], set(), [], [], []
    for name, node in nodes.items():
        assert "entrypoint" not in node, f"{name} should use the image's flower-supernode entry point"
        opts = options(node["command"])
        assert opts["--superlink"] == f"superlink:{link_port}", name
        ca = mount_at(node, opts["--root-certificates"])
        assert ca["source"] == "./credentials/certs/ca.crt" and ca["read_only"] is True, name
        key = mount_at(node, opts["--auth-supernode-private-key"])
        assert key["type"] == "bind" and key["read_only"] is True, name
        assert key["source"].startswith("./credentials/keys/") and not key["source"].endswith(".pub"), name
        keys.append(key["source"])
        node_config = parse_config_args([opts["--node-config"]])
        partitions.append(node_config["partition-id"])
        sizes.add(node_config["num-partitions"])
        state = mount_at(node, node_config["state-dir"])
        assert state["type"] == "volume", f"{name}: state-dir must be on a named volume"
        states.append(state["source"])
        own_data = mount_at(node, "/data")
        assert own_data["type"] == "bind" and own_data["read_only"] is True, name
        data.append(own_data["source"])
        assert not any("ca.key" in str(m["source"]) for m in mounts(node)), f"{name} must not see the CA key"
        depends = node.get("depends_on", [])
        assert "superlink" in depends, name
    assert sorted(partitions) == list(range(len(nodes))), f"partition-ids {partitions} must be 0..{len(nodes) - 1}"
    assert sizes == {len(nodes)}, f"num-partitions {sizes} must equal the number of SuperNodes"
    for what, values in (("private key", keys), ("state volume", states), ("data folder", data)):
        assert len(set(values)) == len(values), f"SuperNodes share a {what}: {values}"


@pytest.mark.parametrize("config", compose_configs())
def test_compose_named_volumes_are_declared_and_used(config):
    used = {m["source"] for s in config["services"].values() for m in mounts(s) if m["type"] == "volume"}
    declared = set(config.get("volumes") or {})
    assert used == declared, f"used but not declared: {used - declared}; declared but unused: {declared - used}"
    for service in config["services"].values():
        assert not any("ca.key" in str(m["source"]) for m in mounts(service)), "ca.key stays offline"


@pytest.mark.parametrize("override", [p for p in OVERRIDES if "gpu" in p.name], ids=lambda p: p.name)
def test_gpu_override_gives_every_supernode_a_gpu_on_the_cuda_image(override):
    base, extra = load_yaml(BASE_COMPOSE), load_yaml(override)
    merged = deep_merge(base, extra)
    assert set(extra["services"]) <= set(base["services"]), "the override names a service compose.yaml lacks"
    for name in supernodes(base):
        assert name in extra["services"], f"{name} would run without a GPU"
        service = merged["services"][name]
        assert service["image"] != base["services"][name]["image"], f"{name} keeps the CPU image tag"
        dockerfile = ROOT / service["build"]["dockerfile"]
        assert "NVIDIA_VISIBLE_DEVICES" in env_values(dockerfile), f"{name} builds {dockerfile.name}"
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices), name


def strings_in(value) -> list[str]:
    """Every string in a YAML value, nested ones included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def device_node(config: dict) -> dict:
    service = config["services"].get("supernode")
    assert service, "compose.yaml has no `supernode` service (the SuperNode-only profile)"
    return service


DEVICE_ENV = {
    "FEDAPP_SUPERLINK": "link.example.org:9092",
    "FEDAPP_NODE_KEY": "/etc/fedapp/node.key",
    "FEDAPP_NODE_DATA": "/srv/fedapp/data",
    "FEDAPP_PARTITION_ID": "3",
    "FEDAPP_NUM_PARTITIONS": "5",
}


@pytest.mark.parametrize("config", compose_configs())
def test_compose_supernode_profile_is_one_device_node_that_up_leaves_out(config):
    node = device_node(config)
    assert node.get("profiles") == ["supernode"], "a plain `docker compose up` must not start it"
    assert "supernode" not in default_services(config)
    assert (ROOT / node["build"]["dockerfile"]).resolve() == SUPERNODE_DOCKERFILE
    image_extras = interpolate(str(node["build"]["args"]["EXTRAS"]), {})
    assert image_extras == build_args(SUPERNODE_DOCKERFILE)["EXTRAS"] == "", "the lean image by default"
    assert interpolate(str(node["build"]["args"]["EXTRAS"]), {"FEDAPP_SUPERNODE_EXTRAS": "clip"}) == "clip"
    assert not node.get("ports") and not node.get("expose"), "a SuperNode publishes nothing"
    assert not node.get("depends_on"), "`up supernode` must start nothing else (the SuperLink is elsewhere)"
    assert "entrypoint" not in node, "the image's flower-supernode entry point"


@pytest.mark.parametrize("env", [{}, DEVICE_ENV], ids=["defaults", "device-env"])
@pytest.mark.parametrize("config", compose_configs())
def test_compose_supernode_profile_mounts_its_credentials_read_only_and_keeps_state_on_a_volume(config, env):
    node = device_node(config)
    opts = {k: interpolate(v or "", env) for k, v in options(node["command"]).items()}
    host, _, port = opts["--superlink"].rpartition(":")
    assert host and port == options(config["services"]["superlink"]["command"])["--port"]
    if env:
        assert opts["--superlink"] == env["FEDAPP_SUPERLINK"]
    ca = mount_at(node, opts["--root-certificates"])
    assert ca["source"] == "./credentials/certs/ca.crt" and ca["read_only"] is True
    key = mount_at(node, opts["--auth-supernode-private-key"])
    assert key["type"] == "bind" and key["read_only"] is True
    assert key["bind"]["create_host_path"] is False, "a missing key must fail, not become an empty folder"
    key_source = interpolate(key["source"], env)
    assert not key_source.endswith(".pub")
    assert key_source == env.get("FEDAPP_NODE_KEY", key_source)
    other_keys = {mount_at(s, "/credentials/node.key")["source"] for s in supernodes(config).values()}
    assert key_source not in other_keys, "the device node must not default to another node's key"
    node_config = parse_config_args([opts["--node-config"]])
    volumes = yaml.safe_load(next(a for k, a in instructions(SUPERNODE_DOCKERFILE) if k == "VOLUME"))
    assert node_config["data-dir"] in volumes and node_config["state-dir"] in volumes
    data = mount_at(node, node_config["data-dir"])
    assert data["type"] == "bind" and data["read_only"] is True
    assert interpolate(data["source"], env) == env.get("FEDAPP_NODE_DATA", interpolate(data["source"], {}))
    state = mount_at(node, node_config["state-dir"])
    assert state["type"] == "volume" and state["source"] in (config.get("volumes") or {})
    others = {m["source"] for name, s in config["services"].items() if name != "supernode" for m in mounts(s)}
    assert state["source"] not in others, "its state volume is its own"
    assert 0 <= node_config["partition-id"] < node_config["num-partitions"]
    if env:
        assert (node_config["partition-id"], node_config["num-partitions"]) == (3, 5)
    assert not any("ca.key" in str(m["source"]) or "server.key" in str(m["source"]) for m in mounts(node))


def test_compose_general_image_default_profile_matches_the_dockerfiles():
    for name, service in default_services(load_yaml(BASE_COMPOSE)).items():
        extras = service["build"]["args"]["FEDAPP_EXTRAS"]
        assert interpolate(extras, {}) == build_args(ROOT / service["build"]["dockerfile"])["FEDAPP_EXTRAS"], name


def compose_settings() -> dict[str, str]:
    """``${VAR:-default}`` of the ``supernode`` service: each variable and its default."""
    found = {}
    for text in strings_in(device_node(load_yaml(BASE_COMPOSE))):
        found.update(re.findall(r"\$\{(\w+):-([^}]*)\}", text))
    return found


def test_compose_supernode_settings_are_documented_with_their_defaults():
    settings = compose_settings()
    assert {"FEDAPP_SUPERLINK", "FEDAPP_NODE_KEY", "FEDAPP_NODE_DATA", "FEDAPP_PARTITION_ID"} <= set(settings)
    compose_text = BASE_COMPOSE.read_text()
    table = one_device_section().split("| Variable | Default | Meaning |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for variable, default in settings.items():
        assert variable in compose_text.split("services:")[0], f"{variable}: not in compose.yaml's header"
        (row,) = [r for r in rows if f"`{variable}`" in r.split("|")[1]] or [None]
        assert row, f"docs/docker.md's table does not name {variable}"
        shown = row.split("|")[2]
        assert (f"`{default}`" in shown) if default else ("empty" in shown), f"{variable}: default {default!r}"


# --- scripts -------------------------------------------------------------------------------------


def test_scripts_are_found():
    assert {p.name for p in SCRIPTS} >= {"make-certs.sh", "make-node-keys.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_passes_shellcheck(script):
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    done = run([dev_tool("shellcheck"), "-x", script])  # -x: the sourced credentials-folder.sh too
    assert done.returncode == 0, done.stdout + done.stderr


def cert_text(path: Path) -> str:
    done = run(["openssl", "x509", "-in", path, "-noout", "-text"])
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_openssl
def test_make_certs_issues_a_server_cert_the_ca_verifies(tmp_path):
    out = tmp_path / "certs"
    done = run([MAKE_CERTS, out, "DNS:link.example.org", "IP:10.1.2.3"])
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "server.key", "server.pem"]
    verify = run(["openssl", "verify", "-CAfile", out / "ca.crt", out / "server.pem"])
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stdout + verify.stderr
    text = cert_text(out / "server.pem")
    sans = ("DNS:link.example.org", "IP Address:10.1.2.3", "DNS:superlink", "DNS:localhost", "IP Address:127.0.0.1")
    for san in sans:
        assert san in text, f"{san} missing from the server certificate"
    assert "TLS Web Server Authentication" in text
    assert "CA:TRUE" in cert_text(out / "ca.crt")
    for secret in ("ca.key", "server.key"):
        assert stat.S_IMODE((out / secret).stat().st_mode) & 0o077 == 0, f"{secret} is readable by others"


@needs_openssl
@pytest.mark.parametrize(
    "san", ["link.example.org", "DNS:a b", "DNS:a,IP:1.2.3.4", "IP:10.0.0.256", "IP:nope", "URI:x"]
)
def test_make_certs_refuses_a_malformed_san_and_writes_nothing(tmp_path, san):
    out = tmp_path / "certs"
    done = run([MAKE_CERTS, out, san])
    assert done.returncode != 0
    assert san in done.stderr
    assert not out.exists() or not any(out.iterdir())


@needs_openssl
def test_make_certs_never_overwrites_credentials(tmp_path):
    out = tmp_path / "certs"
    assert run([MAKE_CERTS, out]).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    done = run([MAKE_CERTS, out, "DNS:other.example.org"])
    assert done.returncode != 0
    assert "exists" in done.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@needs_openssl
def test_make_certs_leaves_no_partial_credentials_when_openssl_fails(tmp_path):
    # An openssl that fails when signing the server certificate, after the CA exists.
    fake = tmp_path / "bin"
    fake.mkdir()
    real = shutil.which("openssl")
    (fake / "openssl").write_text(f'#!/bin/sh\n[ "$1" = x509 ] && {{ echo boom >&2; exit 1; }}\nexec {real} "$@"\n')
    (fake / "openssl").chmod(0o755)
    out = tmp_path / "certs"
    done = run([MAKE_CERTS, out], env={**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode != 0
    assert "boom" in done.stderr
    assert list(out.iterdir()) == []
    assert run([MAKE_CERTS, out]).returncode == 0, "a retry must not be blocked by leftovers"


@needs_ssh_keygen
def test_make_node_keys_writes_p384_key_pairs(tmp_path):
    out = tmp_path / "keys"
    done = run([MAKE_NODE_KEYS, out, "node-0", "node-1"])
    assert done.returncode == 0, done.stderr
    for name in ("node-0", "node-1"):
        public = (out / f"{name}.pub").read_text().split()
        assert public[0] == "ecdsa-sha2-nistp384"
        assert stat.S_IMODE((out / name).stat().st_mode) & 0o077 == 0, f"{name} is readable by others"
        derived = run(["ssh-keygen", "-y", "-f", out / name])
        assert derived.returncode == 0 and derived.stdout.split()[:2] == public[:2], "private and public keys differ"
    assert (out / "node-0.pub").read_text() != (out / "node-1.pub").read_text()


@needs_ssh_keygen
@pytest.mark.parametrize("name", ["../escape", "a b", "-rf", "node.pub", ".hidden", ""])
def test_make_node_keys_rejects_a_bad_name_before_writing_anything(tmp_path, name):
    out = tmp_path / "keys"
    done = run([MAKE_NODE_KEYS, out, "good", name])
    assert done.returncode != 0
    assert "node name" in done.stderr
    assert not out.exists() or not any(out.iterdir()), "no key may be written when a name is bad"


@needs_ssh_keygen
def test_make_node_keys_never_overwrites_a_key(tmp_path):
    out = tmp_path / "keys"
    assert run([MAKE_NODE_KEYS, out, "node-0"]).returncode == 0
    before = (out / "node-0").read_bytes()
    done = run([MAKE_NODE_KEYS, out, "node-0"])
    assert done.returncode != 0 and "exists" in done.stderr
    assert (out / "node-0").read_bytes() == before


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` substitution (the only form these files use)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), text)


def published(port: str, env: dict[str, str]) -> tuple[str, str, str]:
    """``(host address, host port, container port)`` of a short-syntax port, with ``${VAR:-default}`` resolved."""
    host, host_port, container_port = interpolate(port, env).rsplit(":", 2)
    return host, host_port, container_port


@pytest.mark.parametrize("config", compose_configs())
def test_only_the_superlink_publishes_a_port_and_on_loopback_by_default(config):
    """Fleet and Control share port 9092 in Flower 1.42: by default it is reachable from this host only,
    and FEDAPP_SUPERLINK_BIND moves it to the interface the devices use; no SuperNode publishes anything."""
    services = config["services"]
    assert [name for name, service in services.items() if service.get("ports")] == ["superlink"]
    (port,) = services["superlink"]["ports"]
    assert published(port, {}) == ("127.0.0.1", "9092", "9092")
    assert published(port, {"FEDAPP_SUPERLINK_BIND": "10.0.0.5"}) == ("10.0.0.5", "9092", "9092")


# --- docs/docker.md: one device, one container ---------------------------------------------------


def one_device_section() -> str:
    text = DOCKER_DOCS.read_text()
    start = text.find("## One device, one container")
    assert start >= 0, "docs/docker.md has no section 'One device, one container'"
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def code_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```\w*\n(.*?)^```", markdown, re.MULTILINE | re.DOTALL)


DOCKER_RUN_VALUES = {"--name", "--restart", "-v", "--volume", "--runtime", "-e", "--env", "--network", "--user"}
DOCKER_RUN_FLAGS = {"-d", "--detach", "--init", "--rm"}


def documented_docker_run() -> tuple[dict[str, list[str]], str, list[str]]:
    """The section's ``docker run``: its options (each a list of values), the image, and the
    arguments after the image (the entry point's)."""
    (block,) = [b for b in code_blocks(one_device_section()) if "docker run" in b]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == ["docker", "run"], words[:2]
    found: dict[str, list[str]] = {}
    i = 2
    while words[i].startswith("-"):
        name, eq, value = words[i].partition("=")
        if name in DOCKER_RUN_FLAGS:
            found.setdefault(name, [])
        else:
            assert name in DOCKER_RUN_VALUES, f"unknown docker run option {name} (teach this test about it)"
            if not eq:
                i, value = i + 1, words[i + 1]
            found.setdefault(name, []).append(value)
        i += 1
    return found, words[i], words[i + 1 :]


def test_docs_docker_run_names_every_volume_and_argument_of_the_supernode_image():
    docker_opts, image, node_args = documented_docker_run()
    built = re.search(r"-f docker/Dockerfile\.supernode -t (\S+) \.", SUPERNODE_DOCKERFILE.read_text())
    assert built and image == built.group(1), f"runs {image}, the Dockerfile's header builds another tag"
    assert docker_opts.get("--restart") == ["unless-stopped"]
    binds = {}
    for volume in docker_opts.get("-v", []) + docker_opts.get("--volume", []):
        source, target, *mode = volume.split(":")
        binds[target] = (source, mode == ["ro"])
    assert not any("ca.key" in source or "server.key" in source for source, _ in binds.values())
    declared = yaml.safe_load(next(a for k, a in instructions(SUPERNODE_DOCKERFILE) if k == "VOLUME"))
    missing = [v for v in declared if v not in binds]
    assert not missing, f"the docker run mounts nothing at {missing}, which the image declares as volumes"
    opts = options(node_args)
    device_opts = options(device_node(load_yaml(BASE_COMPOSE))["command"])
    assert set(opts) == set(device_opts), "the docker run and the compose profile pass different arguments"
    for flag in ("--root-certificates", "--auth-supernode-private-key"):
        assert opts[flag] in binds and binds[opts[flag]][1], f"{flag} {opts[flag]} must be mounted read-only"
    assert not binds[opts["--auth-supernode-private-key"]][0].endswith(".pub")
    host, _, port = opts["--superlink"].rpartition(":")
    assert host and port == "9092"
    node_config = parse_config_args([opts["--node-config"]])
    assert node_config["data-dir"] == "/data" and node_config["state-dir"] == "/state"
    assert binds["/data"][1], "the device's data is mounted read-only"
    state_source = binds[node_config["state-dir"]][0]
    assert not state_source.startswith(("/", ".", "~")), "state on a named volume"
    assert 0 <= node_config["partition-id"] < node_config["num-partitions"]


def test_docs_explain_building_and_running_the_supernode_image():
    section = one_device_section()
    blocks = "\n".join(code_blocks(section))
    assert MULTI_ARCH_BUILD in blocks
    assert "INSTALL_TORCH=false" in blocks and "l4t-pytorch" in blocks
    assert re.search(r"docker compose .*--profile supernode up -d .*supernode$", blocks, re.MULTILINE)
    undocumented = [name for name in build_args(SUPERNODE_DOCKERFILE) if f"`{name}`" not in section]
    assert not undocumented, f"build arguments of Dockerfile.supernode not in docs/docker.md: {undocumented}"
    never = re.search(r"[Nn]ever copy(.*?)\.(\s|$)", section, re.DOTALL)
    assert never, "say which files never go to a device"
    for secret in ("ca.key", "server.key"):
        assert f"`{secret}`" in never.group(1), f"say that {secret} stays off devices"


def paragraphs_naming(section: str, method: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", section) if f"`{method}`" in p]


def test_docs_say_which_methods_the_lean_image_runs_and_which_need_an_extra():
    """On its own ImageFolder (run config dataset="imagefolder", node config data-dir), a method's
    client needs the extras fedapp.extras says; the section says so for each family by the methods
    that lead it (naming every baseline would make each new method edit this page)."""
    section = one_device_section()
    defaults = resolve_run_config({}).as_dict()
    for method in ("fedavg", "standalone", "pfedlora", "fedd2p", "sdfed", "pep-fedpt"):
        config = RunConfig.from_values({**defaults, "method": method, "dataset": "imagefolder"})
        needs = {r.extra for r, _ in client_requirements(config, own_data_dir=True)}
        named = paragraphs_naming(section, method)
        assert named, f"docs/docker.md does not say whether the lean image runs {method}"
        if needs:
            assert all(any(f"EXTRAS={extra}" in p for p in named) for extra in needs), f"{method} needs {needs}"
        else:
            assert any("EXTRAS=" not in p for p in named), f"{method} runs on the lean image"


@needs_ssh_keygen
@pytest.mark.parametrize("script", [MAKE_CERTS, MAKE_NODE_KEYS], ids=lambda p: p.name)
def test_credentials_are_refused_in_a_folder_git_would_commit_and_accepted_where_it_ignores(tmp_path, script):
    project = tmp_path / "project"
    project.mkdir()
    assert run(["git", "init", "-q", project]).returncode == 0
    (project / ".gitignore").write_text("credentials/\n")
    args = ["DNS:link.example.org"] if script == MAKE_CERTS else ["node-0"]
    done = run([script, "creds", *args], cwd=project)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"inside the git work tree {project}" in done.stderr and "git does not ignore it" in done.stderr
    assert not (project / "creds").exists()  # nothing written, not even the folder
    assert run([script, "credentials/out", *args], cwd=project).returncode == 0
    assert run([script, tmp_path / "outside", *args], cwd=project).returncode == 0


@needs_ssh_keygen
def test_the_ca_key_and_node_keys_are_never_written_into_one_folder(tmp_path):
    assert run([MAKE_CERTS, tmp_path / "certs"]).returncode == 0
    done = run([MAKE_NODE_KEYS, tmp_path / "certs", "node-0"])
    assert done.returncode == 2 and "holds the CA's private key (ca.key)" in done.stderr
    assert not (tmp_path / "certs" / "node-0").exists()
    assert run([MAKE_NODE_KEYS, tmp_path / "keys", "node-0"]).returncode == 0
    done = run([MAKE_CERTS, tmp_path / "keys"])
    assert done.returncode == 2 and "holds node keys" in done.stderr
    assert not (tmp_path / "keys" / "ca.key").exists()
