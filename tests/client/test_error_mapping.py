"""How gRPC errors map onto the library's hierarchy (pure logic: gRPC errors built by hand)."""

from __future__ import annotations

import grpc
import pytest

from etcd_recipes import EtcdConnectionError, TlsHandshakeError
from etcd_recipes.client.rpc import map_grpc_error


def _unavailable(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details
    )


@pytest.mark.parametrize(
    "details",
    [
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: "
        "Ssl handshake failed: SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        "CERTIFICATE_VERIFY_FAILED",
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: "
        "Handshake failed",
        "tsi_peer_get_property failed",
    ],
)
def test_tls_failures_are_tls_errors(details):
    assert isinstance(
        map_grpc_error(_unavailable(details), op="connect", endpoints="e"), TlsHandshakeError
    )


def test_a_cut_short_tcp_connect_is_a_retriable_connection_error():
    """Seen under load in CI: a plain-text client's connect whose TCP phase was cut short.
    It is transient (the client retries within connect_timeout), not a TLS problem."""
    details = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:43861: "
        "tcp handshaker shutdown"
    )
    mapped = map_grpc_error(_unavailable(details), op="connect", endpoints="e")
    assert type(mapped) is EtcdConnectionError and "tcp handshaker shutdown" in str(mapped)
