"""Vendored etcd services that ``aetcd.rpc`` does not cover, with one calling style. Not public.

Each service module (:mod:`.v3lock`, :mod:`.v3election`) is only a field layout and a service
name; :func:`build` turns a layout into message classes -- a ``FileDescriptorProto`` registered
in a **private** descriptor pool, so no ``grpcio-tools`` at build time, no clash with other
copies of etcd's protos (aetcd's, a user's own) and none of the runtime version floors that
generated ``*_pb2.py`` files impose (etcd_recipes supports ``protobuf>=5.27``,
``grpcio>=1.60``). :class:`Method` describes one RPC; calling it with a ``grpc.aio`` channel
gives the multicallable. Only ``client.py`` calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Layout", "Method", "T", "build"]

T = descriptor_pb2.FieldDescriptorProto
"""Field types and labels (``T.TYPE_BYTES``, ...), for the layouts."""

Layout = dict[str, list[tuple[str, int, int, str]]]
"""message name -> [(field name, number, protobuf type, message type name or "")]."""


def build(file_name: str, package: str, layout: Layout) -> dict[str, Any]:
    """The message classes of ``layout`` (by message name), in a private descriptor pool."""
    file = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
    for message, fields in layout.items():
        desc = file.message_type.add(name=message)
        for name, number, ftype, type_name in fields:
            field = desc.field.add(
                name=name, number=number, type=ftype, label=T.LABEL_OPTIONAL, json_name=name
            )
            if type_name:
                field.type_name = f".{package}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in layout
    }


@dataclass(frozen=True)
class Method:
    """One RPC of a vendored service: ``method(channel)`` is its ``grpc.aio`` multicallable
    (unary-unary, or unary-stream when ``streaming``). Hashable: the client caches the
    multicallable per method for the channel's lifetime."""

    path: str  # "/<package>.<Service>/<Rpc>"
    request: Any
    response: Any
    streaming: bool = False

    def __call__(self, channel: Any) -> Any:
        make = channel.unary_stream if self.streaming else channel.unary_unary
        return make(
            self.path,
            request_serializer=self.request.SerializeToString,
            response_deserializer=self.response.FromString,
        )
