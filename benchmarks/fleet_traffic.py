"""Bytes of the Fleet API exchanges that deliver one message, measured against a SuperLink stand-in.

Used by ``bytes.py``. The wire is measured by driving Flower 1.42's own SuperNode client
(``FleetHttpClient`` with its version and node-authentication interceptors, and
Flower's pull/push/confirm helpers) against an in-process stand-in for the
SuperLink that answers as its Fleet handlers do, with the headers its uvicorn
server adds. A message is broken into Flower's content-addressed objects
(Message, RecordDict, records, Array, ArrayChunk), and the SuperNode pulls or
pushes each one in its own request. TCP/IP and TLS framing are not counted.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import httpx
from flwr.app import Message, RecordDict
from flwr.app.message import remove_content_from_message
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.fleet_pb2 import (
    PullMessagesRequest,
    PullMessagesResponse,
    PushMessagesRequest,
    PushMessagesResponse,
    Reconnect,
)
from flwr.proto.message_pb2 import (
    ConfirmMessageReceivedRequest,
    ConfirmMessageReceivedResponse,
    PullObjectRequest,
    PullObjectResponse,
    PushObjectRequest,
    PushObjectResponse,
)
from flwr.proto.node_pb2 import Node
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree, iterate_object_tree
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
    make_push_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.interceptors.http.runtime_version import RuntimeVersionHttpInterceptor
from flwr.supercore.primitives.asymmetric import generate_key_pairs
from flwr.supercore.protobuf.constants import PROTOBUF_MEDIA_TYPE
from flwr.supernode.fleet_http_client import FleetHttpClient
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

#: Identities as a deployment has them: random 63-bit node ids and run ids.
RUN_ID = 0x5E3A_91C4_7D20_1B6F
NODE_ID = 0x6A7F_3C91_D24E_8B05
SUPERLINK = "192.168.0.10:9092"
#: What uvicorn adds to every response (``date``, ``server``), besides the body's own headers.
UVICORN_HEADERS = (("date", "Sat, 28 Nov 2026 12:00:00 GMT"), ("server", "uvicorn"))


@dataclass
class Traffic:
    """Bytes of the HTTP exchanges that deliver one message."""

    requests: int = 0
    protobuf: int = 0  # request and response bodies
    http: int = 0  # bodies plus request/status lines and headers

    def add(self, request: httpx.Request, response: httpx.Response) -> None:
        self.requests += 1
        self.protobuf += len(request.content) + len(response.content)
        target = request.url.raw_path.decode()
        request_head = f"{request.method} {target} HTTP/1.1\r\n".encode()
        response_head = f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n".encode()
        self.http += _framed(request_head, request.headers.raw, request.content)
        self.http += _framed(response_head, response.headers.raw, response.content)


def _framed(start_line: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> int:
    """Bytes of one HTTP/1.1 message: start line, ``name: value`` lines, blank line, body."""
    return len(start_line) + sum(len(k) + 2 + len(v) + 2 for k, v in headers) + 2 + len(body)


class SuperLinkStandIn:
    """Answers the SuperNode's Fleet requests as the SuperLink's handlers do, in process.

    Requests go through Flower's own ``FleetHttpClient`` (httpx, with the
    SuperNode's runtime-version and signed node-identity headers); responses
    carry the protobuf bodies the SuperLink's handlers build and the headers its
    uvicorn server adds. Every exchange is counted in :attr:`traffic`.
    """

    def __init__(self) -> None:
        private_key, public_key = generate_key_pairs()
        self.client = FleetHttpClient(
            f"http://{SUPERLINK}",
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="SuperNode"),
                NodeAuthHttpInterceptor(private_key, public_key),
            ],
        )
        # The same client, its transport replaced by this stand-in (no socket is opened).
        self.client._client = httpx.Client(transport=httpx.MockTransport(self._serve))
        self.node = Node(node_id=NODE_ID)
        self.traffic = Traffic()
        self._store: dict[str, bytes] = {}  # the SuperLink's object store
        self._pending: tuple[Message, Any] | None = None  # an instruction waiting for the node
        self._pushed: list[Message] = []
        self._handlers = {
            "/v1/fleet/pull-messages": (PullMessagesRequest, self._pull_messages),
            "/v1/fleet/pull-object": (PullObjectRequest, self._pull_object),
            "/v1/fleet/confirm-message-received": (ConfirmMessageReceivedRequest, self._confirm),
            "/v1/fleet/push-messages": (PushMessagesRequest, self._push_messages),
            "/v1/fleet/push-object": (PushObjectRequest, self._push_object),
        }

    def _serve(self, request: httpx.Request) -> httpx.Response:
        request_type, handler = self._handlers[request.url.path]
        body = handler(request_type.FromString(request.content)).SerializeToString()
        headers = [*UVICORN_HEADERS, ("content-length", str(len(body))), ("content-type", PROTOBUF_MEDIA_TYPE)]
        response = httpx.Response(200, headers=headers, content=body, request=request)
        self.traffic.add(request, response)
        return response

    # The SuperLink's Fleet handlers (flwr.superlink.servicer.fleet.fleet_handlers), reduced to the bytes.
    def _pull_messages(self, _request: PullMessagesRequest) -> PullMessagesResponse:
        assert self._pending is not None
        message, tree = self._pending
        return PullMessagesResponse(
            messages_list=[message_to_proto(remove_content_from_message(message))], message_object_trees=[tree]
        )

    def _pull_object(self, request: PullObjectRequest) -> PullObjectResponse:
        return PullObjectResponse(
            object_found=True, object_available=True, object_content=self._store[request.object_id]
        )

    def _confirm(self, request: ConfirmMessageReceivedRequest) -> ConfirmMessageReceivedResponse:
        self._pending = None
        self._store.clear()
        return ConfirmMessageReceivedResponse()

    def _push_messages(self, request: PushMessagesRequest) -> PushMessagesResponse:
        tree = request.message_object_trees[0]
        missing = list(dict.fromkeys(t.object_id for t in iterate_object_tree(tree) if t.object_id not in self._store))
        self._pushed.append(message_from_proto(request.messages_list[0]))
        return PushMessagesResponse(
            reconnect=Reconnect(reconnect=5),
            results={request.messages_list[0].metadata.message_id: 0},
            objects_to_push=missing,
            session_id=str(uuid.uuid4()),
        )

    def _push_object(self, request: PushObjectRequest) -> PushObjectResponse:
        self._store[request.object_id] = request.object_content
        return PushObjectResponse(stored=True)

    # ----- what the SuperNode does ---------------------------------------------

    def deliver_instruction(self, message: Message) -> tuple[Traffic, RecordDict]:
        """SuperLink -> SuperNode: the node pulls the message, then each of its objects, then confirms."""
        message.metadata.__dict__["_message_id"] = message.object_id  # as the SuperLink sets it
        self._store = {oid: obj.deflate() for oid, obj in get_all_nested_objects(message).items()}
        self._pending = (message, get_object_tree(message))
        self.traffic = Traffic()
        # start_client_internal._pull_and_store_message
        pulled = self.client.PullMessages(PullMessagesRequest(node=self.node))
        tree = pulled.message_object_trees[0]
        pull = make_pull_object_fn_protobuf(self.client.PullObject, self.node, RUN_ID)
        contents = {oid: pull(oid) for oid in dict.fromkeys(t.object_id for t in iterate_object_tree(tree))}
        make_confirm_message_received_fn_protobuf(self.client.ConfirmMessageReceived, self.node, RUN_ID)(tree.object_id)
        received = inflate_object_from_contents(tree.object_id, contents)
        assert isinstance(received, Message)
        return self.traffic, received.content

    def deliver_reply(self, reply: Message) -> tuple[Traffic, RecordDict]:
        """SuperNode -> SuperLink: the node pushes the message and its object tree, then each missing object."""
        reply.metadata.__dict__["_message_id"] = reply.object_id  # as the ClientApp's runtime sets it
        objects = {oid: obj.deflate() for oid, obj in get_all_nested_objects(reply).items()}
        self.traffic = Traffic()
        # start_client_internal._push_messages
        res = self.client.PushMessages(
            PushMessagesRequest(
                node=self.node,
                messages_list=[message_to_proto(remove_content_from_message(reply))],
                message_object_trees=[get_object_tree(reply)],
                clientapp_runtime_list=[1.0],
            )
        )
        push = make_push_object_fn_protobuf(self.client.PushObject, self.node, RUN_ID, res.session_id)
        for oid in res.objects_to_push:
            push(oid, objects[oid])
        received = inflate_object_from_contents(reply.object_id, dict(self._store))
        assert isinstance(received, Message)
        return self.traffic, received.content
