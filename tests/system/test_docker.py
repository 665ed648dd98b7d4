"""docker/: the images lint clean and agree, compose is consistent, the credential scripts work.

Nothing here needs a Docker engine or the network: Dockerfiles go through
hadolint, the shell scripts through shellcheck (both are dev dependencies), the
compose files are checked as data, and the scripts are run into ``tmp_path``.
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
import yaml
from flwr.common.config import parse_config_args

from tests.paths import ROOT

DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
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


def test_dockerfiles_are_found():
    assert {p.name for p in DOCKERFILES} >= {"Dockerfile", "Dockerfile.cuda"}


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


def supernodes(config: dict) -> dict[str, dict]:
    return {name: s for name, s in config["services"].items() if "--superlink" in options(s.get("command", []))}


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


# --- scripts -------------------------------------------------------------------------------------


def test_scripts_are_found():
    assert {p.name for p in SCRIPTS} >= {"make-certs.sh", "make-node-keys.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_passes_shellcheck(script):
    assert os.access(script, os.X_OK), f"{script.name} is not executable"
    done = run([dev_tool("shellcheck"), script])
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


def published(port: str, env: dict[str, str]) -> tuple[str, str, str]:
    """``(host address, host port, container port)`` of a short-syntax port, with ``${VAR:-default}`` resolved."""
    resolved = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), port)
    host, host_port, container_port = resolved.rsplit(":", 2)
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
