"""Errors as the one line a user reads: a client's own message out of Flower's error text, and
Flower's exception records in the ServerApp's process."""

from __future__ import annotations

import logging

from fedapp.errors import ConfigError, client_error_message, error_line
from fedapp.server_app import OneLineErrors

RAY_REASON = (
    "ValueError: Message contains an Error (reason: <class 'ray.exceptions.RayTaskError(ClientAppException)'>:"
    '<\'ray::ClientAppActor.run() (pid=1, ip=1)\n  File "x.py", line 1\nException ClientAppException occurred. '
    "Message: cannot write client state under /proc/x'>). It originated during client-side execution of a message."
)
SUPERNODE_REASON = "<class 'fedapp.errors.DataError'>:<'client 0: its classes ['Cat'] are not the server's ['cat']'>"


def test_a_clients_own_message_is_taken_out_of_flowers_text():
    assert client_error_message(RAY_REASON) == "cannot write client state under /proc/x"
    assert (
        client_error_message(SUPERNODE_REASON)
        == "DataError: client 0: its classes ['Cat'] are not the server's ['cat']"
    )
    died = "<class 'ray.exceptions.ActorDiedError'>:<'The actor died unexpectedly'>"
    assert client_error_message(died) == "ActorDiedError: The actor died unexpectedly"
    assert client_error_message("timed out") == "timed out"


def test_error_line_names_the_projects_error_in_the_chain():
    try:
        try:
            raise ConfigError("config key 'lr' = 0.0 must be > 0.0")
        except ConfigError as err:
            raise RuntimeError("An error was encountered. Ending simulation.") from err
    except RuntimeError as wrapped:
        assert error_line(wrapped) == "config key 'lr' = 0.0 must be > 0.0"
    assert error_line(KeyError("x")) == "KeyError: 'x'"


def record(msg, exc=None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc else None
    return logging.LogRecord("flwr", logging.ERROR, __file__, 1, msg, ("ServerApp",) if "%s" in msg else (), exc_info)


def test_flowers_error_records_become_one_line():
    one_line = OneLineErrors()
    raised = record("%s raised an exception", ConfigError("config key 'lr' = 0.0 must be > 0.0"))
    assert one_line.filter(raised) and raised.getMessage() == "error: config key 'lr' = 0.0 must be > 0.0"
    assert raised.exc_info is None
    assert not one_line.filter(record("Exit Code: 700\nAn unhandled exception occurred."))
    assert not one_line.filter(record("Traceback (most recent call last):\n  File ..."))
    assert not one_line.filter(record("An exception was raised when processing a message by RayBackend"))
    assert one_line.filter(record("SuperLink unavailable"))
    info = logging.LogRecord("flwr", logging.INFO, __file__, 1, "Traceback shown at info", (), None)
    assert one_line.filter(info)


def test_exit_code_paragraph_stays_when_no_error_was_shortened():
    assert OneLineErrors().filter(record("Exit Code: 300\nsomething"))
