"""Bad input raises a typed error and writes nothing (issue 32, item 15): each case used to
escape as a bare ``TypeError``, ``AttributeError``, ``UnicodeEncodeError`` or ``ValueError``."""

from __future__ import annotations

import math
import time

import pytest

from etcd_recipes import (
    EtcdConnectionError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    Op,
    connect,
)
from etcd_recipes.testing import EtcdServer


@pytest.mark.parametrize("endpoints", [12345, [b"127.0.0.1:2379"], b"127.0.0.1:2379", [1]])
def test_connect_refuses_endpoints_of_the_wrong_type(endpoints):
    with pytest.raises(InvalidArgumentTypeError, match="endpoints must be a str"):
        connect(endpoints)


def test_connect_refuses_a_resilience_that_is_no_config():
    with pytest.raises(InvalidArgumentTypeError, match="resilience must be a ResilienceConfig"):
        connect("127.0.0.1:2379", resilience="fast")


async def test_a_key_with_a_lone_surrogate_is_refused_and_nothing_is_written(
    etcd_client, etcd_prefix
):
    key = etcd_prefix + "k\udc80"
    with pytest.raises(InvalidArgumentError, match="lone surrogate at position"):
        await etcd_client.put(key, b"v")
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        Op.put(key, b"v")
    assert (await etcd_client.get_prefix(etcd_prefix)).kvs == []


async def test_a_sort_target_or_order_outside_the_enum_is_refused(etcd_client, etcd_prefix):
    with pytest.raises(InvalidArgumentError, match=r"sort_target must be a SortTarget \(KEY"):
        await etcd_client.range(etcd_prefix, prefix=True, sort_target="x")
    with pytest.raises(InvalidArgumentError, match="sort_order must be a SortOrder"):
        await etcd_client.range(etcd_prefix, prefix=True, sort_order=7)
    with pytest.raises(InvalidArgumentError, match="sort_target"):
        Op.get(etcd_prefix, sort_target="x")
    assert (await etcd_client.range(etcd_prefix, prefix=True, sort_target=2)).kvs == []


@pytest.mark.parametrize(
    ("seconds", "error"),
    [(-1, InvalidArgumentError), (math.nan, InvalidArgumentError), ("1", InvalidArgumentTypeError)],
)
def test_fail_after_refuses_what_is_no_duration(seconds, error):
    from etcd_recipes.sync import fail_after

    with pytest.raises(error, match="fail_after"), fail_after(seconds):
        pass


async def test_a_plain_text_client_of_a_tls_server_is_told_so_quickly():
    with EtcdServer(tls=True) as server:
        plain = server.endpoint.split("://")[-1]
        started = time.monotonic()
        with pytest.raises(EtcdConnectionError, match="as a TLS server does") as info:
            async with connect(plain, connect_timeout=10):
                pass
        assert time.monotonic() - started < 4.0  # not the whole connect_timeout
        assert "https://" in str(info.value) and "ca_cert=" in str(info.value)
