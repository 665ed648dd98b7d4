"""Errors the project raises on purpose, each with a message that names the problem."""

from __future__ import annotations

import re


class FedAppError(Exception):
    """Base class of every error this project raises deliberately."""


class ConfigError(FedAppError, ValueError):
    """A run-config key has an unknown name, a wrong type or an invalid value."""


class DataError(FedAppError, ValueError):
    """A data source is missing, empty, corrupt or cannot be partitioned as asked."""


class ModelError(FedAppError, ValueError):
    """A model name, pretrained tag or checkpoint cannot be resolved."""


class StateError(FedAppError, RuntimeError):
    """A client's persisted state is unreadable or belongs to another run."""


# A client's own message inside the error text Flower hands the server: "<class '...'>:<'MESSAGE'>",
# where a simulated client's MESSAGE ends in "Exception ClientAppException occurred. Message: ...".
_FLOWER_ERROR_REASON = re.compile(r"<class '(?P<kind>[^']*)'>:<'(?P<reason>.*)'>", re.DOTALL)
_CLIENTAPP_MESSAGE = "Message: "


def client_error_message(text: str) -> str:
    """The client's own error inside Flower's text for a failed ClientApp, so the server can
    say in one line why a client failed: the message a simulated client raised, or the
    error's type and message (``ActorDiedError: ...``); the text itself when it holds none."""
    found = _FLOWER_ERROR_REASON.search(text)
    if found is None:
        return text
    reason = found.group("reason")
    if _CLIENTAPP_MESSAGE in reason:
        return reason.rsplit(_CLIENTAPP_MESSAGE, 1)[1].strip()
    kind = found.group("kind").rsplit(".", 1)[-1]
    return f"{kind}: {reason.strip()}"


def error_line(error: BaseException) -> str:
    """One line naming an error: the message of the first of this project's errors in its
    chain (what the project raises on purpose names the problem), else its type and text."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, FedAppError):
            return " ".join(str(current).split())
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return " ".join(f"{type(error).__name__}: {error}".split())
