"""Where things are: the repository root, whichever tier a test lives in."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
