"""The exception hierarchy of etcd-recipes.

Every error this library raises derives from :class:`EtcdRecipeError`. Raw gRPC errors never
leak to callers: :func:`etcd_recipes.client.rpc.map_grpc_error` translates them into the classes
below, each with a message a user can act on.

Misuse errors are also the matching built-in (``ValueError``/``RuntimeError``), and timeouts
are also ``TimeoutError``, so ordinary ``except`` clauses keep working::

    try:
        await client.put("", b"x")
    except ValueError as exc:  # EmptyKeyError is a ValueError too
        print(exc)

Cancellation is never wrapped: a cancelled call re-raises the caller's own cancellation.
"""

from __future__ import annotations

__all__ = [
    "StmConflictError",
    "DuplicateParticipantError",
    "SemaphorePermitMismatchError",
    "LockUpgradeError",
    "LockNotHeldError",
    "LockTimeoutError",
    "AlreadyStartedError",
    "AuthenticationError",
    "ClaimLostError",
    "ClientClosedError",
    "CodecError",
    "CompactedError",
    "ConnectionRetriesExhaustedError",
    "DuplicateKeyError",
    "EmptyKeyError",
    "EmptyPathError",
    "EtcdConnectionError",
    "EtcdRecipeError",
    "EtcdServerError",
    "EtcdTimeoutError",
    "EventStreamOverflowError",
    "ForkedProcessError",
    "FutureRevisionError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "InvalidEndpointError",
    "InvalidPathError",
    "LeadershipLostError",
    "LeaseEventError",
    "LeaseNotFoundError",
    "LockLostError",
    "LostError",
    "NotLeaderError",
    "NoInstancesError",
    "ServiceInstanceNotFoundError",
    "DuplicateServiceInstanceError",
    "NotStartedError",
    "PermissionDeniedError",
    "PermitLostError",
    "QuotaExceededError",
    "RecipeClosedError",
    "RetriesExhaustedError",
    "TimeoutRetriesExhaustedError",
    "TlsHandshakeError",
    "TooManyOperationsError",
    "UsageError",
    "ValueTooLargeError",
    "WatchFailedError",
    "WrongEventLoopError",
]


class EtcdRecipeError(Exception):
    """Root of every error raised by etcd-recipes.

    Example::

        from etcd_recipes import EtcdRecipeError, connect

        try:
            async with connect("127.0.0.1:1", connect_timeout=0.5) as nowhere:
                await nowhere.get("/k")
        except EtcdRecipeError as exc:
            print("etcd call failed:", exc)
    """


# --------------------------------------------------------------------------- transport


class EtcdConnectionError(EtcdRecipeError):
    """No etcd endpoint could be reached (gRPC ``UNAVAILABLE``).

    The message names the endpoints tried and the last transport error.
    """


class TlsHandshakeError(EtcdConnectionError):
    """The TLS handshake failed: wrong CA, missing client certificate, or a plain-text server."""


class EtcdTimeoutError(EtcdRecipeError, TimeoutError):
    """An operation or a wait did not finish in time. Also a built-in :class:`TimeoutError`."""


class LockTimeoutError(EtcdTimeoutError):
    """A lock or permit was not acquired within the ``timeout`` of ``with_lock()`` /
    ``with_permit()``: the body did not run and nothing was left queued in etcd.
    Also a built-in :class:`TimeoutError`.

    Example::

        from etcd_recipes import LockTimeoutError

        async with client.lease(10) as mine, client.lease(10) as theirs:
            key = await client.lock(prefix, mine.id)
            try:
                await client.lock(prefix, theirs.id, timeout=0.5)
            except LockTimeoutError:
                print("busy; try later")
            await client.unlock(key)
    """


class RetriesExhaustedError(EtcdRecipeError):
    """A retried operation gave up; the last failure is chained as ``__cause__``.

    ``attempts`` is the number of attempts made. A call to etcd that gives up raises one of
    the two subclasses, of the same kind as its last failure, so that ``except`` clauses do
    not depend on the retry policy: :class:`ConnectionRetriesExhaustedError` (an
    :class:`EtcdConnectionError`) or :class:`TimeoutRetriesExhaustedError` (an
    :class:`EtcdTimeoutError`). A plain ``RetriesExhaustedError`` is a recipe's own bounded
    retry giving up (a queue's compare-and-swap under contention, for example).
    """

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class ConnectionRetriesExhaustedError(RetriesExhaustedError, EtcdConnectionError):
    """A call to etcd was retried until its policy gave up, and the last attempt could not
    reach any endpoint. Also an :class:`EtcdConnectionError`: ``except EtcdConnectionError``
    means "could not reach etcd" with or without retries.

    Example::

        from etcd_recipes import EtcdConnectionError, connect
        from etcd_recipes.testing import EtcdServer

        with EtcdServer() as doomed:
            async with connect(doomed.url) as short_lived:
                doomed.kill()
                try:
                    await short_lived.get("/k")
                except EtcdConnectionError as exc:  # a ConnectionRetriesExhaustedError
                    assert exc.attempts > 1 and isinstance(exc.__cause__, EtcdConnectionError)
    """


class TimeoutRetriesExhaustedError(RetriesExhaustedError, EtcdTimeoutError):
    """A call to etcd was retried until its policy gave up, and the last attempt timed out (a
    hung or overloaded server). Also an :class:`EtcdTimeoutError` and a :class:`TimeoutError`,
    like the single attempt it would be without retries."""


class StmConflictError(RetriesExhaustedError):
    """A software transaction (:func:`~etcd_recipes.run_stm`, :class:`~etcd_recipes.STM`)
    still conflicted after ``max_retries`` retries: nothing it wrote was committed.
    ``attempts`` is how many times ``apply`` ran.

    Example::

        from etcd_recipes import StmConflictError, run_stm

        async def always_conflicts(stm):
            await stm.get(f"{prefix}/hot")
            await client.put(f"{prefix}/hot", b"changed under the run")
            stm.put(f"{prefix}/result", b"never committed")

        try:
            await run_stm(client, always_conflicts, max_retries=2)
        except StmConflictError as exc:
            print(exc.attempts)  # 3
    """


class AuthenticationError(EtcdRecipeError):
    """Authentication failed: wrong user name or password, or auth is not enabled."""


class PermissionDeniedError(EtcdRecipeError):
    """The authenticated user lacks the role needed for this key or operation."""


class EtcdServerError(EtcdRecipeError):
    """Any other error reported by the etcd server.

    ``code`` is the gRPC status name (for example ``"FAILED_PRECONDITION"``) and ``details`` the
    server's message.
    """

    def __init__(self, message: str, *, code: str = "", details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class CompactedError(EtcdRecipeError):
    """The requested revision has been compacted away.

    ``compact_revision`` is the oldest revision still available, when the server said so
    (``0`` when unknown).
    """

    def __init__(self, message: str, *, compact_revision: int = 0) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class FutureRevisionError(EtcdRecipeError, ValueError):
    """A read asked for a revision the server has not reached yet."""


class LeaseNotFoundError(EtcdRecipeError):
    """The lease does not exist (it expired or was revoked)."""


class LeaseEventError(EtcdRecipeError):
    """A lease event (suspended, expired, failed) recorded as a recipe's background exception;
    ``event`` is the :data:`~etcd_recipes.events.LeaseEvent`."""

    def __init__(self, event: object) -> None:
        super().__init__(f"lease event: {event}")
        self.event = event


class WatchFailedError(EtcdRecipeError):
    """A watch gave up recovering (its retry policy was exhausted); the cause is chained."""


class EventStreamOverflowError(EtcdRecipeError):
    """An event stream's consumer fell ``maxsize`` items behind: the stream ended (after the
    items it had buffered) rather than block its producer or drop items silently. Open a new
    stream -- and, for a cache, read its current state -- to go on."""

    def __init__(self, message: str, *, maxsize: int = 0) -> None:
        super().__init__(message)
        self.maxsize = maxsize


class QuotaExceededError(EtcdServerError):
    """etcd's database is over its space quota (``mvcc: database space exceeded``; the server's
    ``--quota-backend-bytes``, 2 GiB by default). etcd has raised its ``NOSPACE`` alarm and
    refuses writes (reads and deletes still work) until an operator frees space and disarms
    the alarm: ``etcdctl compact``, ``etcdctl defrag``, ``etcdctl alarm disarm``. Never
    retried. The write that crossed the quota may have been applied all the same (etcd applies
    a write already committed, then reports the error): read back before assuming either way;
    writes refused once the alarm is raised are not applied."""


class NotLeaderError(EtcdRecipeError):
    """An election operation was made with a stale leadership key."""


# --------------------------------------------------------------------------- discovery


class NoInstancesError(EtcdRecipeError, LookupError):
    """A :class:`~etcd_recipes.ServiceProvider` has no available instance of its service
    (none registered, all filtered out or disabled, or all inside their down window).
    ``service`` is the service name. Also a built-in :class:`LookupError`.

    Example::

        from etcd_recipes import NoInstancesError, ServiceProvider

        async with ServiceProvider(client, f"{prefix}/services", "nobody") as provider:
            try:
                provider.get_instance()
            except NoInstancesError as exc:
                print(exc.service)  # nobody
    """

    def __init__(self, message: str, *, service: str = "") -> None:
        super().__init__(message)
        self.service = service


class ServiceInstanceNotFoundError(EtcdRecipeError, LookupError):
    """The service instance is not registered: ``query_for_instance`` found no record, or
    ``update``/``unregister`` was given an instance this registry did not register. Also a
    built-in :class:`LookupError`."""


class DuplicateServiceInstanceError(EtcdRecipeError):
    """``register`` was given an instance whose id is already registered under its service
    name -- by this registry, or by anyone (the record exists in etcd). Registration never
    overwrites another registrant's record."""


# --------------------------------------------------------------------------- bad input


class InvalidArgumentError(EtcdRecipeError, ValueError):
    """A value passed to etcd-recipes is not acceptable. Also a built-in :class:`ValueError`."""


class InvalidEndpointError(InvalidArgumentError):
    """An endpoint string could not be parsed (expected ``host:port`` or an http(s) URL)."""


class EmptyKeyError(InvalidArgumentError):
    """A key was empty; etcd rejects empty keys."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type (``client=None``, ``timeout="5"``, ``limit="5"``).
    Also a built-in :class:`TypeError` (and, as every argument error, a :class:`ValueError`)."""


class EmptyPathError(InvalidArgumentError):
    """A recipe path was empty."""


class InvalidPathError(InvalidArgumentError):
    """A recipe path is not absolute (no leading ``/``), has an empty segment (``//``) or a
    NUL character; nothing is written anywhere the caller did not name."""


class ValueTooLargeError(InvalidArgumentError):
    """A request exceeded the server's size limit (``--max-request-bytes``, 1.5 MiB by default)."""


class TooManyOperationsError(InvalidArgumentError):
    """A transaction had more operations than the server allows (``--max-txn-ops``, 128)."""


class DuplicateKeyError(InvalidArgumentError):
    """A transaction wrote the same key twice."""


class CodecError(InvalidArgumentError):
    """A value could not be encoded or decoded by its codec; the codec's error is chained."""


class SemaphorePermitMismatchError(InvalidArgumentError):
    """The semaphore's stored permit count differs from this instance's ``permits``.

    The first instance on a path fixes the count; delete ``<path>/permits`` (with no holders
    left) to change it. Also a built-in :class:`ValueError`.

    Example::

        from etcd_recipes import DistributedSemaphore, SemaphorePermitMismatchError

        async with DistributedSemaphore(client, prefix, permits=5) as first:
            assert await first.acquire()
            other = DistributedSemaphore(client, prefix, permits=3)
            try:
                await other.start()
            except SemaphorePermitMismatchError as exc:
                assert (exc.requested, exc.canonical) == (3, 5)
            await other.aclose()
            await first.release()
    """

    def __init__(self, message: str, *, path: str, requested: int, canonical: int) -> None:
        super().__init__(message)
        self.path = path
        self.requested = requested
        self.canonical = canonical


# --------------------------------------------------------------------------- misuse


class UsageError(EtcdRecipeError, RuntimeError):
    """The API was used in a way it does not support. Also a built-in :class:`RuntimeError`."""


class ClientClosedError(UsageError):
    """The client was used after ``aclose()`` (or before it was opened)."""


class WrongEventLoopError(UsageError):
    """An async client was used from an event loop other than the one that opened it."""


class ForkedProcessError(UsageError):
    """A client was used in a child process after ``fork()``; create clients after forking."""


class AlreadyStartedError(UsageError):
    """``start()`` was called twice on a one-shot recipe."""


class NotStartedError(UsageError):
    """The recipe needs ``start()`` (or ``async with``) before this call."""


class RecipeClosedError(UsageError):
    """The recipe was used after ``aclose()``."""


class LockNotHeldError(UsageError):
    """``release()`` (or a fencing call) without a hold: the calling task holds nothing, and
    no hold of a finished task is left. Also a built-in :class:`RuntimeError`.

    Example::

        from etcd_recipes import DistributedMutex, LockNotHeldError

        async with DistributedMutex(client, prefix) as mutex:
            try:
                await mutex.release()
            except LockNotHeldError:
                pass  # this task never acquired it
    """


class LockUpgradeError(UsageError):
    """A task holding the read lock asked for the write lock. Upgrading is refused because
    two upgrading readers would wait for each other forever; release the read lock first.
    Also a built-in :class:`RuntimeError`.

    Example::

        from etcd_recipes import DistributedReadWriteLock, LockUpgradeError

        async with DistributedReadWriteLock(client, prefix) as rw, rw.read_lock:
            try:
                await rw.write_lock.acquire()
            except LockUpgradeError:
                pass  # release the read lock first
    """


class DuplicateParticipantError(UsageError):
    """Another live candidate uses the same ``client_id`` on this election path.

    A candidate's participation key is ``<path>/participants/<client_id>``; a leftover key from
    a previous process is waited for (up to twice the lease TTL) before this is raised.

    Example::

        from etcd_recipes import DuplicateParticipantError, LeaderLatch

        async with LeaderLatch(client, prefix, client_id="node-1", lease_ttl=1):
            twin = LeaderLatch(client, prefix, client_id="node-1", lease_ttl=1)
            try:
                await twin.start()
            except DuplicateParticipantError:
                pass  # two processes were configured with the same client id
            await twin.aclose()
    """


# --------------------------------------------------------------------------- lost holds


class LostError(EtcdRecipeError):
    """An exclusive hold or claim was lost (its lease expired or its key was deleted)."""


class LockLostError(LostError):
    """A lock hold was lost while the body was running; the body was cancelled."""


class PermitLostError(LostError):
    """A semaphore permit was lost."""


class LeadershipLostError(LostError):
    """Leadership was lost (the term's lease expired or its key was deleted)."""


class ClaimLostError(LostError):
    """A work-queue claim was lost; another consumer may now process the item."""
