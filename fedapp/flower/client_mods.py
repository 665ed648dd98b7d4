"""The mods every ClientApp of this project carries: SecAgg+ masking and client-side DP clipping.

Both pass a message through unless the server asked for what they do, so one
ClientApp serves every run. They live apart from the server halves
(:mod:`fedapp.flower.secure_aggregation`, :mod:`fedapp.flower.privacy`) so that a
SuperNode's ClientApp process, started anew for every message, imports none of
Flower's server side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context, Message
from flwr.app.message_type import MessageType
from flwr.client.mod import fixedclipping_mod, secaggplus_mod
from flwr.clientapp.mod import fixedclipping_mod as message_fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError


def secagg_client_mod(overrides: Mapping[str, Any] | None = None, *, ignore_unknown: bool = False) -> Callable:
    """The ClientApp mod: Flower's ``secaggplus_mod`` for the messages of a SecAgg+ round.

    ``secaggplus_mod`` itself requires the SecAgg+ config record in every train
    message; this one passes a train message without it (a plain fit
    instruction) through, unless the client's own run config (``overrides`` on
    top of Flower's) says ``secagg = true``: then it refuses, so that a client
    configured for secure aggregation never uploads its arrays unmasked.
    """

    def optional_secaggplus_mod(msg: Message, ctxt: Context, call_next: Callable) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, ctxt)
        if RECORD_KEY_CONFIGS in msg.content.config_records:
            return secaggplus_mod(msg, ctxt, call_next)
        if _wants_secagg({**ctxt.run_config, **(overrides or {})}, ignore_unknown):
            raise ConfigError(
                "this client runs with 'secagg' = true, but the server sent a plain fit instruction (no SecAgg+ "
                "round); refusing to upload its arrays unmasked"
            )
        return call_next(msg, ctxt)

    return optional_secaggplus_mod


def _wants_secagg(run_config: Mapping[str, Any], ignore_unknown: bool) -> bool:
    """Whether the run config turns secure aggregation on (a preset may)."""
    if not run_config.get("preset") and run_config.get("secagg") is not True:
        return False  # the common case, without validating the whole config per message
    try:
        return bool(resolve_run_config(run_config, ignore_unknown=ignore_unknown)["secagg"])
    except ConfigError:
        return False  # the client_fn raises the same error for this message


def dp_clipping_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Flower's ``fixedclipping_mod`` where the server asks for clipping, a pass-through elsewhere.

    ``fixedclipping_mod`` raises on a training message without a clipping norm
    in its config; this mod lets such messages (``dp`` = ``off`` or ``server``)
    through, so every ClientApp of this project can carry it.
    """
    if msg.metadata.message_type == MessageType.TRAIN and not msg.has_error():
        # A legacy fit instruction keeps its config here (flwr.compat's FitIns encoding) ...
        config = msg.content.config_records.get("fitins.config")
        if config is not None and KEY_CLIPPING_NORM in config:
            return fixedclipping_mod(msg, ctxt, call_next)
        # ... a Message-API one in "config", clipped by the Message API's own mod.
        config = msg.content.config_records.get("config")
        if config is not None and KEY_CLIPPING_NORM in config:
            return message_fixedclipping_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)
