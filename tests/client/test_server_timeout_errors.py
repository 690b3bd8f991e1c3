"""etcd's own deadline reaches the client as ``UNKNOWN: context deadline exceeded`` -- what a
member cut off from its leader answers to a lease grant or a linearizable read (issue 31,
item 3). It is transient (retried on another attempt, which round robin sends to another
member) and typed as a timeout. Pure mapping logic: a stand-in error, no server."""

from __future__ import annotations

import grpc

from etcd_recipes import EtcdServerError, EtcdTimeoutError
from etcd_recipes.client.rpc import is_retriable, map_grpc_error


class _Err(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_etcds_own_deadline_is_a_retriable_timeout():
    err = _Err(grpc.StatusCode.UNKNOWN, "context deadline exceeded")
    assert is_retriable(err)
    mapped = map_grpc_error(err, op="lease_grant", endpoints="a:2379")
    assert isinstance(mapped, EtcdTimeoutError) and "cut off from its leader" in str(mapped)


def test_other_unknown_errors_are_neither():
    err = _Err(grpc.StatusCode.UNKNOWN, "something else entirely")
    assert not is_retriable(err)
    assert isinstance(map_grpc_error(err, op="get", endpoints="a:2379"), EtcdServerError)
