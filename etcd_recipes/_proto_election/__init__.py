"""A minimal, wire-compatible copy of etcd's ``v3election`` service, built at run time.

No generated code and no ``grpcio-tools``: the message classes come from a
``FileDescriptorProto`` assembled here and registered in a **private** descriptor pool, so
they never clash with other copies of etcd's protos (aetcd's, a user's own) and impose no
``protobuf``/``grpcio`` version floor (reference env.md §4).

Package, message names and field numbers are those of etcd's
``server/etcdserver/api/v3election/v3electionpb/v3election.proto``; ``ResponseHeader`` and
``KeyValue`` are local, wire-compatible copies of ``etcdserverpb.ResponseHeader`` and
``mvccpb.KeyValue``.

Example::

    req = MESSAGES["CampaignRequest"](name=b"job", lease=lease_id, value=b"me")
    call = method(channel, "Campaign")(req, metadata=md)
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["MESSAGES", "SERVICE", "method", "stream_method"]

SERVICE = "v3electionpb.Election"
"""The full gRPC service name."""

_T = descriptor_pb2.FieldDescriptorProto
_BYTES, _INT64, _UINT64, _MESSAGE = _T.TYPE_BYTES, _T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_MESSAGE

# message name -> [(field name, number, type, message type name or "")]
_LAYOUT: dict[str, list[tuple[str, int, int, str]]] = {
    "ResponseHeader": [
        ("cluster_id", 1, _UINT64, ""),
        ("member_id", 2, _UINT64, ""),
        ("revision", 3, _INT64, ""),
        ("raft_term", 4, _UINT64, ""),
    ],
    "KeyValue": [
        ("key", 1, _BYTES, ""),
        ("create_revision", 2, _INT64, ""),
        ("mod_revision", 3, _INT64, ""),
        ("version", 4, _INT64, ""),
        ("value", 5, _BYTES, ""),
        ("lease", 6, _INT64, ""),
    ],
    "CampaignRequest": [
        ("name", 1, _BYTES, ""),
        ("lease", 2, _INT64, ""),
        ("value", 3, _BYTES, ""),
    ],
    "CampaignResponse": [
        ("header", 1, _MESSAGE, "ResponseHeader"),
        ("leader", 2, _MESSAGE, "LeaderKey"),
    ],
    "LeaderKey": [
        ("name", 1, _BYTES, ""),
        ("key", 2, _BYTES, ""),
        ("rev", 3, _INT64, ""),
        ("lease", 4, _INT64, ""),
    ],
    "LeaderRequest": [("name", 1, _BYTES, "")],
    "LeaderResponse": [("header", 1, _MESSAGE, "ResponseHeader"), ("kv", 2, _MESSAGE, "KeyValue")],
    "ResignRequest": [("leader", 1, _MESSAGE, "LeaderKey")],
    "ResignResponse": [("header", 1, _MESSAGE, "ResponseHeader")],
    "ProclaimRequest": [("leader", 1, _MESSAGE, "LeaderKey"), ("value", 2, _BYTES, "")],
    "ProclaimResponse": [("header", 1, _MESSAGE, "ResponseHeader")],
}

# rpc name -> (request message, response message)
_METHODS: dict[str, tuple[str, str]] = {
    "Campaign": ("CampaignRequest", "CampaignResponse"),
    "Proclaim": ("ProclaimRequest", "ProclaimResponse"),
    "Leader": ("LeaderRequest", "LeaderResponse"),
    "Observe": ("LeaderRequest", "LeaderResponse"),
    "Resign": ("ResignRequest", "ResignResponse"),
}


def _build() -> dict[str, Any]:
    package = SERVICE.rpartition(".")[0]
    fdp = descriptor_pb2.FileDescriptorProto(
        name="etcd_recipes/_proto_election/v3election_min.proto",
        package=package,
        syntax="proto3",
    )
    for name, fields in _LAYOUT.items():
        msg = fdp.message_type.add(name=name)
        for field_name, number, kind, type_name in fields:
            field = msg.field.add(
                name=field_name, number=number, type=kind, label=_T.LABEL_OPTIONAL
            )
            if type_name:
                field.type_name = f".{package}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in _LAYOUT
    }


MESSAGES: dict[str, Any] = _build()
"""Message classes by name (``MESSAGES["CampaignRequest"](name=b"x", lease=7)``)."""


def method(channel: Any, rpc: str) -> Any:
    """The unary-unary multicallable of ``rpc`` (``"Campaign"``, ``"Leader"``, ...) on a
    ``grpc.aio`` channel.

    Example::

        call = method(channel, "Leader")(MESSAGES["LeaderRequest"](name=b"job"), timeout=5)
    """
    request, response = _METHODS[rpc]
    return channel.unary_unary(
        f"/{SERVICE}/{rpc}",
        request_serializer=MESSAGES[request].SerializeToString,
        response_deserializer=MESSAGES[response].FromString,
    )


def stream_method(channel: Any, rpc: str) -> Any:
    """The unary-stream multicallable of ``rpc`` (only ``"Observe"``).

    Example::

        call = stream_method(channel, "Observe")(MESSAGES["LeaderRequest"](name=b"job"))
    """
    request, response = _METHODS[rpc]
    return channel.unary_stream(
        f"/{SERVICE}/{rpc}",
        request_serializer=MESSAGES[request].SerializeToString,
        response_deserializer=MESSAGES[response].FromString,
    )
