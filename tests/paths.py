"""Where things are: the repository root, whichever tier a test lives in, and the benchmark scripts."""

import importlib.util
import signal
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def load_script(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as module ``name`` (the folder is not a package; the
    scripts put it on ``sys.path``, so the worker processes they spawn import them by that name)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executing
    spec.loader.exec_module(module)
    return module


def takes_ctrl_c() -> None:
    """``preexec_fn`` of a process a test interrupts with SIGINT: Ctrl-C's default action in the
    child even when this run ignores SIGINT (a shell starts a background job so, and children
    inherit it), as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
