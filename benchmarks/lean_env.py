"""A lean install of the project in a venv of its own, as an edge device has it.

``build_lean_venv`` makes a venv, brings torch and torchvision (the device's own choice of
build: CPU, CUDA or Jetson) and then ``pip install <project>`` with no extras, so the venv
holds exactly what the base profile pulls in. By default torch and its requirements are
linked from the running environment instead of installed again (a CUDA build is gigabytes
and minutes): pip sees them installed and adds nothing for them, as on a device that
installed its torch first. ``footprint`` measures an environment's installed packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import Distribution, distributions
from pathlib import Path

TORCH_DISTRIBUTIONS = ("torch", "torchvision")

PACKAGE_FILES = ("pyproject.toml", "README.md", "fedapp", "strategies", "clients")
"""What ``pip install <project>`` builds the package from (the Docker images copy the same)."""


def normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirement_closure(roots: tuple[str, ...], dists: dict[str, Distribution]) -> set[str]:
    """The distributions ``roots`` need, transitively, among ``dists`` (with the extras each
    requirement asks for; markers that do not apply left out). A root is a name or a
    requirement with extras (``"fedapp[all]"``: what ``pip install .[all]`` pulls in)."""
    from packaging.requirements import Requirement  # noqa: PLC0415 - pip's packaging, only for this

    seen: set[tuple[str, str]] = set()
    stack = []
    for root in roots:
        requirement = Requirement(root)
        stack.extend((normalized(requirement.name), e) for e in ("", *requirement.extras))
    while stack:
        name, extra = stack.pop()
        if (name, extra) in seen or name not in dists:
            continue
        seen.add((name, extra))
        for text in dists[name].requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                child = normalized(requirement.name)
                stack.extend((child, e) for e in ("", *requirement.extras))
    return {name for name, _ in seen}


def venv_env(bin_dir: Path | None, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (this process's environment by default) for a process of another venv: no
    variable that points Python at this one's packages (``PYTHONPATH``: Flower's Ray backend
    writes this process's ``sys.path`` there when a simulation runs in it), with ``bin_dir``
    first on ``PATH``."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _installed() -> dict[str, Distribution]:
    return {normalized(d.metadata["Name"]): d for d in distributions()}


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def link_torch(venv: Path) -> list[str]:
    """Link torch, torchvision and what they need from this environment into ``venv``."""
    dists = _installed()
    names = sorted(requirement_closure(TORCH_DISTRIBUTIONS, dists))
    target = _site_packages(venv)
    for name in names:
        dist = dists[name]
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            link = target / top
            if source.exists() and not link.exists() and top != "__pycache__":
                link.symlink_to(source)
    return names


def build_lean_venv(venv: Path, project: Path, *, extras: str = "", link_torch_from_here: bool = True) -> Path:
    """Create ``venv`` with the project's base install (``extras``: e.g. ``"clip"``); its Python.

    Raises ``subprocess.CalledProcessError`` with pip's output if the install fails.
    """
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, capture_output=True)
    if link_torch_from_here:
        link_torch(venv)
    python = venv / "bin" / "python"
    # Installed from a copy of what the package is built from: a build writes build/ and
    # *.egg-info next to its sources, which must not land in the user's checkout.
    source = venv / "source"
    for name in PACKAGE_FILES:
        if (project / name).is_dir():
            shutil.copytree(project / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(project / name, source / name)
    spec = f"{source}[{extras}]" if extras else str(source)
    env = venv_env(None)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", spec],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return python


@dataclass(frozen=True)
class Footprint:
    """An environment's installed distributions: all of them, and apart from torch's."""

    packages: int
    megabytes: float
    torch_packages: int
    torch_megabytes: float

    @property
    def other_packages(self) -> int:
        return self.packages - self.torch_packages

    @property
    def other_megabytes(self) -> float:
        return self.megabytes - self.torch_megabytes


_FOOTPRINT_SCRIPT = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from lean_env import _installed, normalized, requirement_closure, TORCH_DISTRIBUTIONS
dists = _installed()
within, alone = json.loads(sys.argv[2]), json.loads(sys.argv[3])
if within:
    wanted = requirement_closure(tuple(within), dists) | {normalized(name) for name in alone}
    dists = {n: d for n, d in dists.items() if n in wanted}
def size(d):
    total = 0
    for f in d.files or []:
        try:
            total += os.path.getsize(d.locate_file(f))
        except OSError:
            pass
    return total
sizes = {n: size(d) for n, d in dists.items()}
torch = requirement_closure(TORCH_DISTRIBUTIONS, dists)
print(json.dumps({"sizes": sizes, "torch": sorted(torch)}))
"""


def installed_sizes(
    python: Path, within: tuple[str, ...] = (), alone: tuple[str, ...] = ()
) -> tuple[dict[str, int], set[str]]:
    """Bytes per installed distribution of ``python``'s environment (only those ``within``
    needs and those ``alone`` names, when ``within`` is given: see :func:`footprint`), and
    torch's closure there."""
    # Isolated (-I) and run from the venv's folder: no checkout's *.egg-info in the current
    # folder, nor PYTHONPATH, passes for a distribution of the venv.
    command = [str(python), "-I", "-c", _FOOTPRINT_SCRIPT, str(Path(__file__).parent)]
    out = subprocess.run(
        [*command, json.dumps(list(within)), json.dumps(list(alone))],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(python).parent,
    ).stdout
    found = json.loads(out)
    return found["sizes"], set(found["torch"])


def profile_requirements(project: Path, extra: str = "") -> tuple[str, ...]:
    """What ``pip install '<project>[<extra>]'`` asks for, read from its ``pyproject.toml``
    (not from an installed copy's metadata, which is as old as its install): the base
    dependencies and the extra's, the project's extras that refer to the project itself
    expanded, and ``pip``, which every venv holds."""
    try:
        import tomllib  # noqa: PLC0415 - Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10: flwr brings tomli
        import tomli as tomllib  # noqa: PLC0415

    from packaging.requirements import Requirement  # noqa: PLC0415

    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    optional = meta.get("optional-dependencies", {})
    found, seen, pending = list(meta.get("dependencies", [])), set(), [extra] if extra else []
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in optional[name]:
            requirement = Requirement(text)
            if normalized(requirement.name) == normalized(meta["name"]):
                pending.extend(requirement.extras)
            else:
                found.append(text)
    return (*dict.fromkeys(found), "pip")


def footprint(python: Path, within: tuple[str, ...] = (), alone: tuple[str, ...] = ()) -> Footprint:
    """What ``python``'s environment holds (symlinked files count at their target's size).

    ``within``: count only the distributions these requirements pull in, transitively, as
    installed there, and those named in ``alone`` (without what they require): e.g.
    ``profile_requirements(project, "all")`` and the project's own name, to count the
    ``[all]`` install inside a ``[dev]`` venv, a superset of it.
    """
    return footprint_of(*installed_sizes(python, within, alone))


def footprint_of(sizes: dict[str, int], torch: set[str]) -> Footprint:
    """The :class:`Footprint` of :func:`installed_sizes`' answer."""
    return Footprint(
        packages=len(sizes),
        megabytes=sum(sizes.values()) / 1e6,
        torch_packages=len(torch & sizes.keys()),
        torch_megabytes=sum(sizes[n] for n in torch if n in sizes) / 1e6,
    )
