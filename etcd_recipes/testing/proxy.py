"""A tiny TCP proxy for network-fault tests: :class:`TcpProxy`.

The proxy runs its own asyncio event loop in a daemon thread, so it works the same under
synchronous and asynchronous tests. Put it between a client and etcd, then:

- :meth:`TcpProxy.cut` resets every open connection (TCP RST) — like a crashed peer or a
  dropped NAT entry; new connections are still forwarded;
- :meth:`TcpProxy.blackhole` silently drops all bytes in both directions while connections
  stay open — like a network partition;
- :meth:`TcpProxy.stall` stops forwarding but keeps every byte: connections stay open and
  silent, each side's sends back up (TCP flow control), and nothing is lost -- a congested
  link, a peer whose process stopped reading, a middlebox holding packets;
- :meth:`TcpProxy.restore` forwards again (and resets the connections that lived through a
  blackhole: their HTTP/2 byte stream is corrupt, so clients must reconnect; a stall's
  connections go on where they stopped, with nothing reset).

Example::

    from etcd_recipes import connect
    from etcd_recipes.testing import TcpProxy

    with TcpProxy.for_endpoint(endpoints) as proxy:
        async with connect(endpoints=[proxy.url]) as proxied:
            await proxied.put(prefix + "k", b"v")
            proxy.blackhole()  # calls through the proxy now time out; keepalive notices
            proxy.restore()  # forwarding again; the connection is reset and re-established
            assert (await proxied.get(prefix + "k")).value == b"v"
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

from etcd_recipes.errors import AlreadyStartedError, InvalidArgumentError, NotStartedError
from etcd_recipes.testing._process import StartStop

__all__ = ["TcpProxy"]

_T = TypeVar("_T")
_CHUNK = 65536
_LINGER_RST = struct.pack("ii", 1, 0)


class _Connection:
    """One client connection and (unless accepted during a blackhole) its upstream leg."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.handler: asyncio.Task[object] | None = asyncio.current_task()
        self.tainted = False  # lived through a blackhole: its byte stream has gaps

    def reset(self) -> None:
        """Abort both legs with a TCP RST (SO_LINGER 1, 0)."""
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class TcpProxy(StartStop):
    """Forward ``listen_host:listen_port`` to ``target_host:target_port``, with fault switches.

    ``listen_port=0`` picks a free port (see :attr:`endpoint`). All methods are thread-safe
    and may be called from any thread, including from inside an async test.

    Example::

        import grpc

        from etcd_recipes.testing import TcpProxy

        host, port = endpoints.rsplit(":", 1)
        proxy = TcpProxy(host, int(port)).start()
        try:
            with grpc.insecure_channel(proxy.endpoint) as channel:
                grpc.channel_ready_future(channel).result(timeout=5)
                proxy.cut()  # open streams fail with UNAVAILABLE (connection reset)
        finally:
            proxy.stop()
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        if not 0 < target_port < 65536:
            raise InvalidArgumentError(f"invalid target port {target_port}")
        if not 0 <= listen_port < 65536:
            raise InvalidArgumentError(f"invalid listen port {listen_port}")
        self._target = (target_host, target_port)
        self._listen_host = listen_host
        self._listen_port = listen_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._blackholed = False
        self._stalled = False
        self._flowing: asyncio.Event | None = None  # created on the proxy's loop
        self._lock = threading.Lock()

    @classmethod
    def for_endpoint(cls, endpoint: str, *, listen_port: int = 0) -> TcpProxy:
        """A proxy for ``host:port`` or an ``http(s)://host:port`` URL (not started).

        Example::

            from etcd_recipes.testing import TcpProxy

        proxy = TcpProxy.for_endpoint(f"http://{endpoints}").start()  # or "host:port"
        try:
            assert proxy.endpoint != endpoints  # it listens on a free port of its own
        finally:
            proxy.stop()
        """
        hostport = endpoint.split("://", 1)[-1].rstrip("/")
        host, sep, port = hostport.rpartition(":")
        if not sep or not port.isdigit():
            raise InvalidArgumentError(f"expected host:port, got {endpoint!r}")
        return cls(host.strip("[]"), int(port), listen_port=listen_port)

    # ------------------------------------------------------------------ lifecycle

    def _started(self) -> bool:
        return self._thread is not None

    def __repr__(self) -> str:
        listen = f"{self._listen_host}:{self._listen_port}"
        return f"<TcpProxy {listen} -> {self._target[0]}:{self._target[1]}>"

    def start(self) -> TcpProxy:
        """Start listening and forwarding (in a daemon thread); return ``self``.

        After :meth:`stop` it may be started again, on the same port.

        Example::

            from etcd_recipes.testing import TcpProxy

        proxy = TcpProxy.for_endpoint(endpoints).start()
        first = proxy.endpoint
        proxy.stop()
        proxy.start()  # again, on the same port
        assert proxy.endpoint == first
        proxy.stop()
        """
        with self._lock:
            if self._thread is not None:
                raise AlreadyStartedError(f"{self!r} is already running")
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            failure: list[BaseException] = []

            def run() -> None:
                asyncio.set_event_loop(loop)
                try:
                    self._server = loop.run_until_complete(
                        asyncio.start_server(
                            self._handle, self._listen_host, self._listen_port, backlog=128
                        )
                    )
                except BaseException as exc:
                    failure.append(exc)
                    ready.set()
                    loop.close()
                    return
                sock = self._server.sockets[0]
                self._listen_port = int(sock.getsockname()[1])
                ready.set()
                try:
                    loop.run_forever()
                finally:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                    loop.close()

            thread = threading.Thread(target=run, name=f"etcd-recipes-{self!r}", daemon=True)
            thread.start()
            ready.wait()
            if failure:
                thread.join()
                raise failure[0]
            self._loop = loop
            self._thread = thread
        return self

    def stop(self) -> None:
        """Close the listener and reset every connection; idempotent.

        Example::

            from etcd_recipes.testing import TcpProxy

            proxy = TcpProxy.for_endpoint(endpoints).start()
            proxy.stop()
            proxy.stop()  # no-op
        """
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None:
                return
            self._loop = self._thread = None
        if threading.current_thread() is thread:  # pragma: no cover - misuse from the loop
            raise RuntimeError("TcpProxy.stop() cannot be called from the proxy's own thread")
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    async def _shutdown(self) -> None:
        server = self._server
        self._server = None
        if server is not None:
            server.close()
        handlers = [c.handler for c in self._connections if c.handler is not None]
        self._reset_all()
        if handlers:
            await asyncio.wait(handlers, timeout=2)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    # ------------------------------------------------------------------ properties

    @property
    def endpoint(self) -> str:
        """``host:port`` the proxy listens on (known after :meth:`start`)."""
        if self._listen_port == 0:
            raise NotStartedError("the proxy has no port yet; call start() first")
        return f"{self._listen_host}:{self._listen_port}"

    @property
    def url(self) -> str:
        """``http://host:port`` of the proxy (a TLS client can use ``https://`` instead).

        Example::

            from etcd_recipes import connect
        from etcd_recipes.testing import TcpProxy

        with TcpProxy.for_endpoint(endpoints) as proxy:
            assert proxy.url == f"http://{proxy.endpoint}"
            async with connect(endpoints=[proxy.url]) as proxied:
                await proxied.put(prefix + "k", b"v")
        """
        return f"http://{self.endpoint}"

    @property
    def connection_count(self) -> int:
        """Number of client connections currently open through the proxy."""
        return len(self._connections)

    @property
    def is_blackholed(self) -> bool:
        """Whether :meth:`blackhole` is in effect."""
        return self._blackholed

    @property
    def is_stalled(self) -> bool:
        """Whether :meth:`stall` is in effect."""
        return self._stalled

    # ------------------------------------------------------------------ faults

    def cut(self) -> None:
        """Reset (TCP RST) all open connections; new connections are still forwarded.

        Returns once the resets are done.

        Example::

            import grpc

            from etcd_recipes.testing import TcpProxy

            with TcpProxy.for_endpoint(endpoints) as proxy:
                with grpc.insecure_channel(proxy.endpoint) as channel:
                    grpc.channel_ready_future(channel).result(timeout=5)
                    assert proxy.connection_count == 1
                    proxy.cut()
                    assert proxy.connection_count == 0
        """
        self._call(self._reset_all)

    def retarget(self, endpoint: str) -> None:
        """Forward new connections to ``endpoint`` (``host:port`` or a URL) and reset the open
        ones: the clients reconnect to another server behind the same address -- what a
        restore from a backup, or a new cluster, looks like to them.

        Example::

            from etcd_recipes.testing import TcpProxy

            with TcpProxy.for_endpoint(endpoints) as proxy:
                proxy.retarget(endpoints)  # the same server again, after a reset
                assert endpoints.split("://")[-1] in repr(proxy)
        """
        hostport = endpoint.split("://", 1)[-1].rstrip("/")
        host, sep, port = hostport.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"not a host:port endpoint: {endpoint!r}")
        with self._lock:
            self._target = (host, int(port))
        self.cut()

    def blackhole(self) -> None:
        """Silently drop all bytes in both directions, keeping connections open.

        New connections are accepted but nothing is forwarded. Undo with :meth:`restore`.

        Example::

            from etcd_recipes.testing import ExternalEtcdServer, TcpProxy

            with TcpProxy.for_endpoint(endpoints) as proxy:
                proxy.blackhole()
                assert proxy.is_blackholed
                through = ExternalEtcdServer([proxy.endpoint])
                timeouts = ("--dial-timeout=300ms", "--command-timeout=300ms")
                assert through.etcdctl("get", "k", *timeouts).returncode != 0  # nothing answers
        """
        self._call(self._start_blackhole)

    def stall(self) -> None:
        """Stop forwarding, dropping nothing: open connections stay open and silent.

        The proxy stops reading from both legs, so each side's sends fill the socket buffers
        and then block, as over a congested link; new connections are accepted and stall too.
        :meth:`restore` lets every held byte through, in order, with no connection reset --
        what a peer that never noticed the stall sees.

        Example::

            import grpc

            from etcd_recipes.testing import TcpProxy

            with TcpProxy.for_endpoint(endpoints) as proxy:
                with grpc.insecure_channel(proxy.endpoint) as channel:
                    grpc.channel_ready_future(channel).result(timeout=5)
                    proxy.stall()
                    assert proxy.is_stalled and proxy.connection_count == 1
                    proxy.restore()
                    assert not proxy.is_stalled and proxy.connection_count == 1
        """
        self._call(self._start_stall)

    def restore(self) -> None:
        """Forward normally again after :meth:`blackhole` or :meth:`stall`; connections that
        lived through a blackhole are reset, those that lived through a stall go on.

        Example::

            from etcd_recipes.testing import ExternalEtcdServer, TcpProxy

            with TcpProxy.for_endpoint(endpoints) as proxy:
                proxy.blackhole()
                proxy.restore()
                assert not proxy.is_blackholed
                ExternalEtcdServer([proxy.endpoint]).etcdctl("endpoint", "health", check=True)
        """
        self._call(self._end_blackhole)

    # ------------------------------------------------------------------ internals

    def _call(self, fn: Callable[[], _T]) -> _T:
        loop = self._loop
        if loop is None:
            raise NotStartedError(f"{self!r} is not running; call start() first")
        if threading.current_thread() is self._thread:
            return fn()

        async def run() -> _T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=10)

    def _reset_all(self) -> None:
        connections = list(self._connections)
        self._connections.clear()
        for conn in connections:
            conn.reset()

    def _start_blackhole(self) -> None:
        self._blackholed = True
        for conn in self._connections:
            conn.tainted = True

    def _flow(self) -> asyncio.Event:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        return self._flowing

    def _start_stall(self) -> None:
        self._stalled = True
        self._flow().clear()

    def _end_blackhole(self) -> None:
        self._blackholed = False
        self._stalled = False
        self._flow().set()
        tainted = [c for c in self._connections if c.tainted]
        for conn in tainted:
            self._connections.discard(conn)
            conn.reset()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer)
        self._connections.add(conn)
        try:
            if self._blackholed:
                conn.tainted = True
                await self._pump(reader, None, conn)
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
            except OSError:
                conn.reset()  # target down: look like a refused connection to the client
                return
            if conn not in self._connections:  # cut while connecting
                up_writer.transport.abort()
                return
            conn.upstream = up_writer
            loop = asyncio.get_running_loop()
            conn.tasks = [
                loop.create_task(self._pump(reader, up_writer, conn)),
                loop.create_task(self._pump(up_reader, writer, conn)),
            ]
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            if conn in self._connections:
                self._connections.discard(conn)
                for task in conn.tasks:
                    task.cancel()
                for w in (conn.client, conn.upstream):
                    if w is not None:
                        w.transport.close()

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter | None,
        conn: _Connection,
    ) -> None:
        flowing = self._flow()
        try:
            while True:
                await flowing.wait()  # a stall: read nothing, so the sender backs up
                data = await src.read(_CHUNK)
                if not data:
                    return
                if self._blackholed or conn.tainted or dst is None:
                    continue  # dropped on the floor
                await flowing.wait()  # read just before a stall: held, not lost
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.CancelledError):
            return
