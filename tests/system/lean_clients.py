"""Our ClientApp's clients, served from a lean install to a test process over a pipe.

Run with a lean venv's Python (no pytest there, so this file imports only fedapp and
flwr). Each request on stdin is a length-prefixed pickle:

- ``("fit" | "evaluate", run_config, [(partition, node_config, ins), ...])``: each
  instruction goes to a client that the ClientApp's own ``client_fn`` builds for the
  node, from a ``Context`` that lives as long as this process (Flower's semantics: one
  client per message, the node's context carried between them);

and the reply, on stdout, is the pickled list of results (or ``("error", text)``).
Everything the clients print goes to stderr, so stdout carries only replies.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import traceback


def read_message(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def write_message(stream, value) -> None:
    body = pickle.dumps(value)
    stream.write(struct.pack("<Q", len(body)) + body)
    stream.flush()


def main() -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a client's prints must not reach the replies

    # Imported after the redirect: an import that prints must not reach the replies either.
    from flwr.common import Context, RecordDict  # noqa: PLC0415

    from fedapp.client_app import make_client_fn  # noqa: PLC0415

    client_fn = make_client_fn()
    contexts: dict[tuple, Context] = {}
    requests = sys.stdin.buffer
    while (request := read_message(requests)) is not None:
        kind, run_config, instructions = request
        try:
            results = []
            for partition, node_config, ins in instructions:
                key = (tuple(sorted(run_config.items())), partition)
                if key not in contexts:
                    contexts[key] = Context(partition, partition, dict(node_config), RecordDict(), dict(run_config))
                client = client_fn(contexts[key])
                results.append(getattr(client, kind)(ins))
            write_message(replies, results)
        except Exception:  # reported to the test, which fails naming it
            write_message(replies, ("error", traceback.format_exc()))


if __name__ == "__main__":
    main()
