"""The records of Flower's Message API as our methods use them, and the client's reply.

The edge half of :mod:`fedapp.flower.message_api`: what a ClientApp process needs to
answer a Message-API instruction with a method's ``NumPyClient``, and the record
layout both halves read (that module's docstring has the table). It imports none of
Flower's server side, so a SuperNode's ClientApp process, started anew for every
message, does not load the link state and strategies it never uses.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.common import Scalar

ARRAYS, CONFIG, METRICS, DETAILS = "arrays", "config", "metrics", "details"
NUM_EXAMPLES, LOSS = "num-examples", "loss"
#: The ConfigRecord of a ``query`` reply: the client's properties (its partition, for the sampler).
PROPERTIES = "properties"


# ----- records <-> the legacy values ---------------------------------------------


def split_metrics(metrics: Mapping[str, Scalar], **reserved: int | float) -> RecordDict:
    """``{"metrics": MetricRecord, "details": ConfigRecord}``: the numbers of ``metrics`` (and
    ``reserved``, e.g. ``num-examples``) in the first, the rest (text, flags) in the second."""
    clash = sorted(set(metrics) & set(reserved))
    if clash:
        raise ValueError(f"client metrics may not be named {', '.join(clash)}: the Message API reply uses them")
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    others = {k: v for k, v in metrics.items() if k not in numbers}
    return RecordDict({METRICS: MetricRecord({**numbers, **reserved}), DETAILS: ConfigRecord(others)})


def joined_metrics(content: RecordDict) -> dict[str, Scalar]:
    """The metrics :func:`split_metrics` split, as one dict again."""
    metrics = dict(content.metric_records[METRICS]) if METRICS in content.metric_records else {}
    details = dict(content.config_records[DETAILS]) if DETAILS in content.config_records else {}
    return {**metrics, **details}


def arrays_of(content: RecordDict) -> list[np.ndarray]:
    """The arrays a message carries, in order (none when it has no ``"arrays"`` record)."""
    return content.array_records[ARRAYS].to_numpy_ndarrays() if ARRAYS in content.array_records else []


def config_of(content: RecordDict) -> dict[str, Scalar]:
    return dict(content.config_records[CONFIG]) if CONFIG in content.config_records else {}


# ----- client side ---------------------------------------------------------------


def is_message_api(message: Message) -> bool:
    """Whether ``message`` is in the Message API's layout (the legacy path's are
    ``fitins.*`` / ``evaluateins.*`` records, or the ``get_properties`` type)."""
    kind = message.metadata.message_type.split(".")[0]
    if kind == MessageType.QUERY:
        return True
    return kind in (MessageType.TRAIN, MessageType.EVALUATE) and (
        ARRAYS in message.content.array_records or CONFIG in message.content.config_records
    )


def answer(client: NumPyClient, message: Message) -> Message:
    """The reply of ``client`` (a method's NumPyClient) to a Message-API ``message``."""
    kind = message.metadata.message_type.split(".")[0]
    config = config_of(message.content)
    if kind == MessageType.QUERY:
        content = RecordDict({PROPERTIES: ConfigRecord(dict(client.get_properties(config)))})
    elif kind == MessageType.TRAIN:
        arrays, num_examples, metrics = client.fit(arrays_of(message.content), config)
        content = split_metrics(metrics, **{NUM_EXAMPLES: int(num_examples)})
        content[ARRAYS] = ArrayRecord([np.asarray(a) for a in arrays])
    elif kind == MessageType.EVALUATE:
        loss, num_examples, metrics = client.evaluate(arrays_of(message.content), config)
        content = split_metrics(metrics, **{NUM_EXAMPLES: int(num_examples), LOSS: float(loss)})
    else:
        raise ValueError(f"message type {message.metadata.message_type!r} is not train, evaluate or query")
    return Message(content, reply_to=message)
