"""Errors the project raises on purpose, each with a message that names the problem."""

from __future__ import annotations


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
