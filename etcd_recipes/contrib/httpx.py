"""``httpx`` transports that send each request to an instance picked by a discovery provider.

Mount one per service on an ordinary client; the URL's host names the service, and the
transport rewrites it to the address of the instance the provider picks::

    client = httpx.AsyncClient(mounts={"http://orders": DiscoveryTransport(provider)})
    await client.get("http://orders/v1/orders/42")  # -> http://<instance>:<port>/v1/orders/42

Guaranteed:

* every request asks ``provider.get_instance()`` once (the provider's strategy decides:
  round-robin by default) and goes to that instance: scheme, host and port come from it
  (``ssl_port`` when the transport's scheme is ``https``), path, query, method, headers and
  body are kept. The ``Host`` header keeps the service's name from the URL;
* an instance that fails is reported with ``provider.note_error(instance)``, exactly once per
  failed request: when connecting to it fails or times out, when it drops the connection or
  breaks the protocol (:class:`httpx.NetworkError`, :class:`httpx.ConnectTimeout`,
  :class:`httpx.RemoteProtocolError` -- the error is re-raised), and when it answers with a
  5xx status (the response is returned). The provider's down policy (``error_threshold``
  errors within its window) then takes the instance out of rotation;
* no instance available: the request fails with :class:`httpx.ConnectError` whose
  ``__cause__`` is the provider's :class:`~etcd_recipes.errors.NoInstancesError` -- an
  ``httpx`` client's error handling (``except httpx.TransportError``) sees it as the
  transport error it is, and nothing is reported to the provider;
* the instance that served a response is in ``response.extensions["service_instance"]``.

Not guaranteed: a request is not retried on another instance (a failed request is the
caller's to retry; ``httpx`` transports' own ``retries=`` only retries connecting to the
same instance); read timeouts and 4xx answers are not reported (a slow or refusing answer
says nothing certain about the instance); TLS verification is against the instance's
address unless the inner transport or the request's ``sni_hostname`` extension says
otherwise. The transport does not start or close the provider (it closes only its inner
transport).
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from etcd_recipes import InvalidArgumentError, NoInstancesError, ServiceInstance

if TYPE_CHECKING:
    from etcd_recipes import ServiceProvider
    from etcd_recipes.sync import ServiceProvider as SyncServiceProvider

__all__ = ["DiscoveryTransport", "SyncDiscoveryTransport"]

#: The ``response.extensions`` key of the instance that served the response.
INSTANCE_EXTENSION = "service_instance"

_REPORTED = (httpx.NetworkError, httpx.ConnectTimeout, httpx.RemoteProtocolError)


class _Provider(Protocol):
    """What the transports use of a provider (both calls are plain, async API or blocking)."""

    def get_instance(self) -> ServiceInstance[Any]: ...
    def note_error(self, instance: ServiceInstance[Any]) -> None: ...


def _scheme(scheme: str) -> str:
    if scheme not in ("http", "https"):
        raise InvalidArgumentError(f"scheme must be 'http' or 'https', got {scheme!r}")
    return scheme


def _target(scheme: str, request: httpx.Request, instance: ServiceInstance[Any]) -> httpx.URL:
    port = instance.ssl_port if scheme == "https" else instance.port
    if not 0 < port < 65536:
        which = "ssl_port" if scheme == "https" else "port"
        raise httpx.ConnectError(
            f"instance {instance.name}/{instance.id} at {instance.address!r} "
            f"has no usable {which} ({port})",
            request=request,
        )
    address = instance.address
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    # One parse of a string: several times cheaper than URL.copy_with (which re-validates
    # every component). raw_path is the path and query, already percent-encoded.
    return httpx.URL(f"{scheme}://{host}:{port}{request.url.raw_path.decode('ascii')}")


def _pick(provider: _Provider, request: httpx.Request) -> ServiceInstance[Any]:
    try:
        instance: ServiceInstance[Any] = provider.get_instance()
    except NoInstancesError as exc:
        raise httpx.ConnectError(
            f"no instance available for {request.url.host!r}: {exc}", request=request
        ) from exc
    return instance


def _routed(scheme: str, request: httpx.Request, instance: ServiceInstance[Any]) -> httpx.Request:
    # A new Request for the inner transport; the caller's keeps the service's URL, so that
    # ``response.request`` (which httpx sets to it) and redirects resolve against the service.
    return httpx.Request(
        request.method,
        _target(scheme, request, instance),
        headers=request.headers,
        stream=request.stream,
        extensions=request.extensions,
    )


class DiscoveryTransport(httpx.AsyncBaseTransport):
    """An ``httpx`` async transport that sends each request to a discovered instance.

    ``provider`` is a started :class:`~etcd_recipes.ServiceProvider`. ``scheme`` is the
    scheme spoken to the instances (``"https"`` uses their ``ssl_port``), whatever the
    mounted URL says.
    ``transport`` is the inner transport requests are forwarded to (default: a new
    :class:`httpx.AsyncHTTPTransport`, closed by :meth:`aclose`; one you pass is closed too,
    as ``httpx`` does with mounted transports). See the module docstring for what is
    reported to the provider.

    Example::

        import httpx
        from etcd_recipes import ServiceInstance, ServiceProvider, ServiceRegistry
        from etcd_recipes.contrib.httpx import DiscoveryTransport

        def network(request: httpx.Request) -> httpx.Response:  # a mock inner transport
            return httpx.Response(200, text=f"{request.url} Host={request.headers['host']}")

        path = f"{prefix}/services"
        async with ServiceRegistry(client, path) as registry:
            await registry.register(ServiceInstance("orders", "", address="10.1.2.3", port=8080))
            async with ServiceProvider(client, path, "orders") as provider:
                transport = DiscoveryTransport(provider, transport=httpx.MockTransport(network))
                async with httpx.AsyncClient(mounts={"http://orders": transport}) as http:
                    response = await http.get("http://orders/v1/orders?id=42")
        assert response.text == "http://10.1.2.3:8080/v1/orders?id=42 Host=orders"
        assert response.request.url == "http://orders/v1/orders?id=42"  # the caller's URL
    """

    def __init__(
        self,
        provider: ServiceProvider[Any],
        *,
        scheme: str = "http",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.provider = provider
        self.scheme = _scheme(scheme)
        self._transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    def __repr__(self) -> str:
        return f"DiscoveryTransport(provider={self.provider!r}, scheme={self.scheme!r})"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` to the instance the provider picks (see the class docstring)."""
        instance = _pick(self.provider, request)
        try:
            response = await self._transport.handle_async_request(
                _routed(self.scheme, request, instance)
            )
        except _REPORTED:
            self.provider.note_error(instance)
            raise
        if response.status_code >= 500:
            self.provider.note_error(instance)
        response.extensions = {**response.extensions, INSTANCE_EXTENSION: instance}
        return response

    async def aclose(self) -> None:
        """Close the inner transport (not the provider)."""
        await self._transport.aclose()

    async def __aenter__(self) -> DiscoveryTransport:
        await self._transport.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self._transport.__aexit__(exc_type, exc_value, traceback)


class SyncDiscoveryTransport(httpx.BaseTransport):
    """The blocking twin of :class:`DiscoveryTransport`, for ``httpx.Client``.

    ``provider`` is a started blocking :class:`etcd_recipes.sync.ServiceProvider`; the
    inner transport defaults to :class:`httpx.HTTPTransport`. Everything else is as in
    :class:`DiscoveryTransport`.

    Example::

        import httpx
        from etcd_recipes.contrib.httpx import SyncDiscoveryTransport
        from etcd_recipes.sync import ServiceInstance, ServiceProvider, ServiceRegistry, connect

        seen = []

        def sick(request: httpx.Request) -> httpx.Response:  # a mock inner transport
            seen.append(str(request.url))
            return httpx.Response(503)

        path = f"{prefix}/services"
        with connect(endpoints) as client, ServiceRegistry(client, path) as registry:
            me = ServiceInstance("orders", "", address="10.1.2.3", port=80, ssl_port=8443)
            registry.register(me)
            with ServiceProvider(client, path, "orders", error_threshold=2) as provider:
                inner = httpx.MockTransport(sick)
                transport = SyncDiscoveryTransport(provider, scheme="https", transport=inner)
                with httpx.Client(mounts={"http://orders": transport}) as http:
                    assert http.get("http://orders/health").status_code == 503
                    assert seen == ["https://10.1.2.3:8443/health"] and not provider.is_down(me)
                    http.get("http://orders/health")  # the second 5xx: "me" is out
                    assert provider.is_down(me)
    """

    def __init__(
        self,
        provider: SyncServiceProvider[Any],
        *,
        scheme: str = "http",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.provider = provider
        self.scheme = _scheme(scheme)
        self._transport = transport if transport is not None else httpx.HTTPTransport()

    def __repr__(self) -> str:
        return f"SyncDiscoveryTransport(provider={self.provider!r}, scheme={self.scheme!r})"

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` to the instance the provider picks (see the class docstring)."""
        instance = _pick(self.provider, request)
        try:
            response = self._transport.handle_request(_routed(self.scheme, request, instance))
        except _REPORTED:
            self.provider.note_error(instance)
            raise
        if response.status_code >= 500:
            self.provider.note_error(instance)
        response.extensions = {**response.extensions, INSTANCE_EXTENSION: instance}
        return response

    def close(self) -> None:
        """Close the inner transport (not the provider)."""
        self._transport.close()

    def __enter__(self) -> SyncDiscoveryTransport:
        self._transport.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        self._transport.__exit__(exc_type, exc_value, traceback)
