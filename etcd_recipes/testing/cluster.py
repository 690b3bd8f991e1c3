"""A real multi-member etcd cluster on loopback for fault tests: :class:`EtcdCluster`.

Every member is an :class:`~etcd_recipes.testing.EtcdServer` (same process management), so
each can be killed, paused, resumed and restarted on its own.

Example::

    from etcd_recipes.testing import EtcdCluster

    with EtcdCluster(size=3) as cluster:
        leader = cluster.leader()
        leader.kill()
        new_leader = cluster.wait_for_leader()
        leader.restart()
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from typing import Any

from etcd_recipes.errors import (
    AlreadyStartedError,
    EtcdTimeoutError,
    InvalidArgumentError,
    UsageError,
)
from etcd_recipes.testing._process import (
    PORT_ATTEMPTS,
    EtcdStartupError,
    PortInUseError,
    StartStop,
    free_ports,
    new_cluster_token,
)
from etcd_recipes.testing.server import EtcdServer, _MemberSpec, _wait_all_ready

__all__ = ["EtcdCluster"]


class EtcdCluster(StartStop):
    """``size`` etcd members started together with a shared ``--initial-cluster``.

    Options are passed to every member (see :class:`~etcd_recipes.testing.EtcdServer`).
    Members are named ``n1``..``nN``; peer traffic is plain HTTP on loopback. A member's
    :meth:`~EtcdServer.restart` reuses its flags and data (``--initial-cluster-state`` is ignored
    once data exists) and waits until it is healthy, which needs a quorum.

    Example::

        from etcd_recipes import connect
        from etcd_recipes.testing import EtcdCluster

        with EtcdCluster(3) as cluster:
            async with connect(**cluster.client_kwargs()) as cluster_client:
                cluster.leader().kill()
                cluster.wait_for_leader()
                await cluster_client.put(prefix + "k", b"v")  # served by a survivor
    """

    def __init__(
        self,
        size: int = 3,
        *,
        fast_election: bool = True,
        grpc_keepalive_min_time: float = 0.5,
        auth_token_ttl: int | None = None,
        extra_args: Sequence[str] = (),
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        if size < 1:
            raise InvalidArgumentError("a cluster needs at least one member")
        if startup_timeout <= 0:
            raise InvalidArgumentError("startup_timeout must be positive")
        self._size = size
        self._options: dict[str, Any] = {
            "fast_election": fast_election,
            "grpc_keepalive_min_time": grpc_keepalive_min_time,
            "auth_token_ttl": auth_token_ttl,
            "extra_args": tuple(extra_args),
            "binary": binary,
            "startup_timeout": startup_timeout,
        }
        self._startup_timeout = startup_timeout
        self._members: list[EtcdServer] = []
        self._closed = False

    # ------------------------------------------------------------------ context manager

    def _started(self) -> bool:
        return bool(self._members)

    def __repr__(self) -> str:
        endpoints = self.endpoints if self._members else []
        return f"<EtcdCluster size={self._size} endpoints={endpoints}>"

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EtcdCluster:
        """Start all members at once and wait until each is healthy; return ``self``.

        Retries with fresh ports when another process grabs one first. Raises
        :class:`~etcd_recipes.testing.EtcdStartupError` with the failing member's log tail.

        Example::

            from etcd_recipes.testing import EtcdCluster

            cluster = EtcdCluster(3).start()
            try:
                assert all(member.is_healthy() for member in cluster.members)
            finally:
                cluster.stop()
        """
        if self._closed:
            raise UsageError("this EtcdCluster was stopped; create a new one")
        if self._members:
            raise AlreadyStartedError(f"{self!r} is already started")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ports = free_ports(2 * self._size)
            token = new_cluster_token()
            names = [f"n{i + 1}" for i in range(self._size)]
            initial = ",".join(
                f"{name}=http://127.0.0.1:{ports[2 * i + 1]}" for i, name in enumerate(names)
            )
            members = [
                EtcdServer(
                    name=name,
                    _member=_MemberSpec(
                        initial_cluster=initial,
                        token=token,
                        client_port=ports[2 * i],
                        peer_port=ports[2 * i + 1],
                    ),
                    **self._options,
                )
                for i, name in enumerate(names)
            ]
            self._members = members
            try:
                for member in members:
                    member._spawn()
                _wait_all_ready(members, time.monotonic() + self._startup_timeout)
                for member in members:
                    member._started_once = True
            except PortInUseError as exc:
                self._stop_members()
                self._members = []
                if attempt == PORT_ATTEMPTS:
                    raise EtcdStartupError(str(exc)) from None
                continue
            except BaseException:
                self._stop_members()
                self._members = []
                raise
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Stop every member and delete their temp dirs. Idempotent.

        Example::

            from etcd_recipes.testing import EtcdCluster

            cluster = EtcdCluster(1).start()
            cluster.stop()
            cluster.stop()  # no-op
            assert not cluster.members[0].is_running
        """
        self._closed = True
        self._stop_members()

    def _stop_members(self) -> None:
        # SIGKILL, not SIGTERM: the data is thrown away anyway, and members stopped together
        # with SIGTERM can spend seconds trying to hand leadership to a peer that is gone.
        for member in self._members:
            member.kill()
        for member in self._members:
            member.stop()

    # ------------------------------------------------------------------ access

    @property
    def size(self) -> int:
        """Number of members."""
        return self._size

    @property
    def members(self) -> list[EtcdServer]:
        """The members, ``n1`` first (a copy of the list; the servers are live objects)."""
        return list(self._members)

    @property
    def endpoints(self) -> list[str]:
        """``host:port`` of every member, e.g. ``["127.0.0.1:41234", ...]``."""
        return [m.endpoint for m in self._members]

    @property
    def urls(self) -> list[str]:
        """Client URLs of every member (``http://...``)."""
        return [m.url for m in self._members]

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`etcd_recipes.client.connect` (all members).

        Example::

            from etcd_recipes import connect
        from etcd_recipes.testing import EtcdCluster

        with EtcdCluster(3) as cluster:
            async with connect(**cluster.client_kwargs()) as cluster_client:  # every member
                await cluster_client.put(prefix + "k", b"v")
        """
        return {"endpoints": self.urls}

    def member(self, name: str) -> EtcdServer:
        """The member called ``name`` (``"n1"``...).

        Example::

            from etcd_recipes.testing import EtcdCluster

        with EtcdCluster(3) as cluster:
            cluster.member("n2").pause()
            assert cluster.member("n2").is_paused
            cluster.member("n2").resume()
        """
        for m in self._members:
            if m.name == name:
                return m
        raise InvalidArgumentError(f"no member named {name!r} in {self!r}")

    # ------------------------------------------------------------------ membership

    def add_member(self) -> EtcdServer:
        """Add a member to the running cluster (``member add``, then start it with
        ``--initial-cluster-state existing``) and wait until it is healthy; it is named
        ``n<N+1>`` and stopped with the cluster.

        Example::

            from etcd_recipes.testing import EtcdCluster

            with EtcdCluster(1) as cluster:
                added = cluster.add_member()
                assert cluster.size == 2 and added.is_healthy()
                cluster.remove_member(added.name)
                assert cluster.size == 1
        """
        if not self._members:
            raise UsageError(f"{self!r} is not started")
        existing = {m.name for m in self._members}
        name = next(f"n{i}" for i in range(len(existing) + 1, 10_000) if f"n{i}" not in existing)
        client_port, peer_port = free_ports(2)
        peer_url = f"http://127.0.0.1:{peer_port}"
        via = self._reachable()[0]
        added = via.etcdctl("member", "add", name, f"--peer-urls={peer_url}", check=True)
        found = re.search(r'ETCD_INITIAL_CLUSTER="([^"]+)"', added.stdout)
        if found is None:  # pragma: no cover - etcdctl always prints it
            raise EtcdStartupError(f"member add printed no initial cluster: {added.stdout!r}")
        member = EtcdServer(
            name=name,
            _member=_MemberSpec(
                initial_cluster=found.group(1),
                token=self._members[0]._token,
                client_port=client_port,
                peer_port=peer_port,
                state="existing",
            ),
            **self._options,
        )
        self._members.append(member)
        self._size += 1
        member._spawn()
        _wait_all_ready([member], time.monotonic() + self._startup_timeout)
        member._started_once = True
        return member

    def remove_member(self, name: str) -> None:
        """Remove member ``name`` from the cluster (``member remove`` through another member),
        then stop it and delete its data.

        Example::

            from etcd_recipes.testing import EtcdCluster

            with EtcdCluster(2) as cluster:
                cluster.remove_member("n2")
                assert [m.name for m in cluster.members] == ["n1"]
        """
        member = self.member(name)
        others = [m for m in self._reachable() if m is not member]
        if not others:
            raise UsageError(f"{name} is the last reachable member; stop the cluster instead")
        # etcd refuses to remove a voting member until the rest have been connected for a
        # while ("unhealthy cluster", its strict reconfiguration check): retry until then.
        deadline = time.monotonic() + self._startup_timeout
        while True:
            done = others[0].etcdctl("member", "remove", f"{member.member_id:x}")
            if done.returncode == 0:
                break
            if "unhealthy" not in done.stderr or time.monotonic() > deadline:
                raise UsageError(f"member remove {name} failed: {done.stderr.strip()}")
            time.sleep(0.2)
        self._members.remove(member)
        self._size -= 1
        member.kill()
        member.stop()

    def _reachable(self) -> list[EtcdServer]:
        return [m for m in self._members if m.is_running and not m.is_paused]

    def leader(self, *, timeout: float = 5.0) -> EtcdServer:
        """The member that currently leads, asking each live member's Maintenance Status.

        Retries while an election runs; raises
        :class:`~etcd_recipes.errors.EtcdTimeoutError` when no leader is found in ``timeout``.

        Example::

            from etcd_recipes.testing import EtcdCluster

            with EtcdCluster(3) as cluster:
                leader = cluster.leader()
                assert leader.status().leader == leader.member_id
        """
        deadline = time.monotonic() + timeout
        while True:
            for m in self._reachable():
                try:
                    st = m.status(timeout=0.5)
                except Exception:
                    continue
                if st.leader and st.leader == st.header.member_id:
                    return m
            if time.monotonic() >= deadline:
                raise EtcdTimeoutError(f"no leader found in {self!r} within {timeout} s")
            time.sleep(0.02)

    def followers(self, *, timeout: float = 5.0) -> list[EtcdServer]:
        """Every member except the current leader (including stopped ones).

        Example::

            from etcd_recipes.testing import EtcdCluster

        with EtcdCluster(3) as cluster:
            followers = cluster.followers()
            assert len(followers) == 2 and cluster.leader() not in followers
        """
        leader = self.leader(timeout=timeout)
        return [m for m in self._members if m is not leader]

    def wait_for_leader(self, timeout: float = 10.0) -> EtcdServer:
        """Wait until every live member reports the same leader, and return it.

        Raises :class:`~etcd_recipes.errors.EtcdTimeoutError` after ``timeout`` seconds.

        Example::

            from etcd_recipes.testing import EtcdCluster

            with EtcdCluster(3) as cluster:
                old = cluster.leader()
                old.kill()
                new = cluster.wait_for_leader(timeout=5)
                assert new is not old
        """
        deadline = time.monotonic() + timeout
        while True:
            reachable = self._reachable()
            by_id: dict[int, EtcdServer] = {}
            seen: set[int] = set()
            complete = bool(reachable)
            for m in reachable:
                try:
                    st = m.status(timeout=0.5)
                except Exception:
                    complete = False
                    break
                by_id[int(st.header.member_id)] = m
                seen.add(int(st.leader))
            if complete and len(seen) == 1:
                (leader_id,) = seen
                if leader_id and leader_id in by_id:
                    return by_id[leader_id]
            if time.monotonic() >= deadline:
                raise EtcdTimeoutError(
                    f"the live members of {self!r} did not agree on a leader within {timeout} s"
                )
            time.sleep(0.02)
