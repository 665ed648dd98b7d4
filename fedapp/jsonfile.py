"""JSON files without NaN: what every JSON file the app writes goes through.

``json.dumps`` writes a float NaN or infinity as a bare ``NaN``/``Infinity``, which is not
JSON: strict readers (``jq``, JavaScript, many loaders) refuse the whole file. A value that
does not exist (a round in which no client was evaluated) is written as null instead.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

__all__ = ["dumps_json", "json_safe"]


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite number replaced by None, inside dicts, lists and
    tuples too."""
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def dumps_json(value: Any, **options: Any) -> str:
    """``json.dumps`` of :func:`json_safe` ``(value)``; anything else JSON cannot hold raises."""
    return json.dumps(json_safe(value), allow_nan=False, **options)
