"""Go gRPC naming interop: records written by ``etcdctl put`` in Go's format appear in the
Python view; Python registrations are byte-identical to Go's; the view survives a
compaction while disconnected (Go's watcher stops on its first watch error)."""

from __future__ import annotations

import asyncio

import pytest

from etcd_recipes import (
    CodecError,
    NamingEndpoint,
    NamingEndpoints,
    connect,
    encode_naming_record,
    naming_registration,
)
from etcd_recipes.testing import TcpProxy
from tests.helpers import eventually

FAST = {"keepalive_time": 1, "keepalive_timeout": 0.5}


def test_the_record_is_gos_json():
    assert encode_naming_record("1.2.3.4:80") == b'{"Op":0,"Addr":"1.2.3.4:80","Metadata":null}'
    assert encode_naming_record("h:1", {"z": [1, True], "a": "x&y"}) == (
        b'{"Op":0,"Addr":"h:1","Metadata":{"a":"x\\u0026y","z":[1,true]}}'
    )
    assert encode_naming_record("h:1", "caf\u00e9\u2028") == (
        '{"Op":0,"Addr":"h:1","Metadata":"caf\u00e9\\u2028"}'.encode()
    )
    with pytest.raises(CodecError):
        NamingEndpoint.from_record("k", b'{"Op":1,"Addr":"h:1"}')
    with pytest.raises(CodecError):
        NamingEndpoint.from_record("k", b'{"Op":0,"Addr":""}')


async def test_an_etcdctl_record_appears_in_the_view(etcd_client, etcd_server, etcd_prefix):
    target = etcd_prefix + "grpc/echo"
    async with NamingEndpoints(etcd_client, target) as view:
        lists = view.updates()
        assert await anext(lists) == ()
        record = '{"Op":0,"Addr":"10.0.0.7:50051","Metadata":{"weight":3}}'
        await asyncio.to_thread(
            etcd_server.etcdctl, "put", f"{target}/10.0.0.7:50051", record, check=True
        )
        (endpoint,) = await asyncio.wait_for(anext(lists), 10)
        assert endpoint == NamingEndpoint(
            f"{target}/10.0.0.7:50051", "10.0.0.7:50051", {"weight": 3}
        )
        await etcd_client.put(f"{target}x/other:1", encode_naming_record("other:1"))  # not ours
        await etcd_client.put(f"{target}/broken", b"{oops")
        await asyncio.to_thread(etcd_server.etcdctl, "del", f"{target}/10.0.0.7:50051", check=True)
        assert await asyncio.wait_for(anext(lists), 10) == ()
        await eventually(lambda: view.has_exceptions, what="the broken record recorded")
        assert isinstance(view.exceptions[0].exception, CodecError)


async def test_a_python_registration_is_what_go_writes(etcd_client, etcd_server, etcd_prefix):
    target = etcd_prefix + "grpc/echo"
    async with naming_registration(
        etcd_client, target, "127.0.0.1:50051", metadata={"zone": "eu"}
    ) as registration:
        out = await asyncio.to_thread(
            etcd_server.etcdctl,
            "get",
            "--print-value-only",
            f"{target}/127.0.0.1:50051",
            check=True,
        )
        assert out.stdout.strip() == '{"Op":0,"Addr":"127.0.0.1:50051","Metadata":{"zone":"eu"}}'
        kv = await etcd_client.get(f"{target}/127.0.0.1:50051")
        assert kv.lease == registration.lease_id != 0
    assert await etcd_client.get(f"{target}/127.0.0.1:50051") is None


@pytest.mark.slow
async def test_the_view_survives_a_compaction_while_disconnected(fresh_etcd_server):
    server = fresh_etcd_server
    proxy = TcpProxy.for_endpoint(server.endpoint).start()
    try:
        async with (
            connect(**server.client_kwargs()) as direct,
            connect(proxy.url, **FAST) as through,
        ):
            await direct.put("echo/a:1", encode_naming_record("a:1"))
            async with NamingEndpoints(through, "echo") as view:
                assert [e.addr for e in view.endpoints()] == ["a:1"]
                proxy.blackhole()
                await eventually(lambda: not view._cache.is_synced, timeout=8, what="noticed")
                await direct.delete("echo/a:1")
                await direct.put("echo/b:2", encode_naming_record("b:2"))
                await direct.compact((await direct.status()).revision)
                proxy.restore()
                await eventually(
                    lambda: [e.addr for e in view.endpoints()] == ["b:2"],
                    timeout=20,
                    what="the view to converge",
                )
                server.restart()
                await direct.put("echo/c:3", encode_naming_record("c:3"))
                await eventually(
                    lambda: [e.addr for e in view.endpoints()] == ["b:2", "c:3"],
                    timeout=20,
                    what="the view after a restart",
                )
    finally:
        proxy.stop()
