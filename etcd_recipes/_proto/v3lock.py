"""etcd's lock service (``v3lockpb.Lock``) with message classes built at run time.

The descriptors below are those of the vendored ``v3lock.proto`` next to this file, built as a
``FileDescriptorProto`` in a private descriptor pool: no ``grpcio-tools`` at build time and none
of the runtime version floors that generated ``*_pb2.py`` files impose (etcd_recipes supports
``protobuf>=5.27`` and ``grpcio>=1.60``). ``tests/locks/test_server_lock.py`` checks that these
descriptors match the ``.proto`` file field by field.

Example::

    request = LockRequest(name=b"/locks/job", lease=lease_id)
    call = lock_method(channel)(request, timeout=None, metadata=None)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "FIELDS",
    "LockRequest",
    "LockResponse",
    "UnlockRequest",
    "UnlockResponse",
    "lock_method",
    "unlock_method",
]

PACKAGE = "v3lockpb"
SERVICE = f"/{PACKAGE}.Lock"

_T = descriptor_pb2.FieldDescriptorProto
FIELDS: dict[str, list[tuple[str, int, int, str]]] = {
    # message -> [(field name, number, type, message type name or "")]
    "ResponseHeader": [
        ("cluster_id", 1, _T.TYPE_UINT64, ""),
        ("member_id", 2, _T.TYPE_UINT64, ""),
        ("revision", 3, _T.TYPE_INT64, ""),
        ("raft_term", 4, _T.TYPE_UINT64, ""),
    ],
    "LockRequest": [("name", 1, _T.TYPE_BYTES, ""), ("lease", 2, _T.TYPE_INT64, "")],
    "LockResponse": [
        ("header", 1, _T.TYPE_MESSAGE, "ResponseHeader"),
        ("key", 2, _T.TYPE_BYTES, ""),
    ],
    "UnlockRequest": [("key", 1, _T.TYPE_BYTES, "")],
    "UnlockResponse": [("header", 1, _T.TYPE_MESSAGE, "ResponseHeader")],
}
"""The messages of ``v3lock.proto``: field name, number, protobuf type and message type."""


def _build() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(
        name="etcd_recipes/v3lock.proto", package=PACKAGE, syntax="proto3"
    )
    for message, fields in FIELDS.items():
        desc = file.message_type.add(name=message)
        for name, number, ftype, type_name in fields:
            field = desc.field.add(
                name=name, number=number, type=ftype, label=_T.LABEL_OPTIONAL, json_name=name
            )
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
    service = file.service.add(name="Lock")
    service.method.add(
        name="Lock", input_type=f".{PACKAGE}.LockRequest", output_type=f".{PACKAGE}.LockResponse"
    )
    service.method.add(
        name="Unlock",
        input_type=f".{PACKAGE}.UnlockRequest",
        output_type=f".{PACKAGE}.UnlockResponse",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in FIELDS
    }


_CLASSES = _build()
LockRequest: Any = _CLASSES["LockRequest"]
LockResponse: Any = _CLASSES["LockResponse"]
UnlockRequest: Any = _CLASSES["UnlockRequest"]
UnlockResponse: Any = _CLASSES["UnlockResponse"]


def _method(channel: Any, name: str, request: Any, response: Any) -> Callable[..., Any]:
    return channel.unary_unary(  # type: ignore[no-any-return]
        f"{SERVICE}/{name}",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )


def lock_method(channel: Any) -> Callable[..., Any]:
    """The ``Lock`` RPC on ``channel`` (a ``grpc.aio`` unary-unary callable)."""
    return _method(channel, "Lock", LockRequest, LockResponse)


def unlock_method(channel: Any) -> Callable[..., Any]:
    """The ``Unlock`` RPC on ``channel`` (a ``grpc.aio`` unary-unary callable)."""
    return _method(channel, "Unlock", UnlockRequest, UnlockResponse)
