"""RedisStore: the cache's tier shared by a fleet of replicas, and one compile per fleet.

An entry is stored under ``corral:cc:<key>``, where the key is ``entries.entry_key`` (it holds
the tokenizer fingerprint, the entry format and the grammar code's version, so replicas running
another Corral never read this one's entries), and its value is the same sealed bytes the disk
store writes (``CompiledConstraint.to_bytes``). Nothing here unpickles or trusts what it reads:
the service checks every entry, and a corrupt or foreign one is a miss that is recompiled.

One compile per fleet. A miss everywhere *claims* the key: in one atomic step it reads the entry
or takes the key's lock (``corral:cc:<key>:lock``, a random token with an expiry of
``lock_ttl_s``). The holder compiles and *publishes* (the entry set and its lock deleted, again
in one step); every other replica polls the same claim until the entry appears, or until the
lock is gone with no entry (the holder failed or died): then it claims the lock itself. While
its compile runs the holder renews its lock, so a lock outlives a dead holder by ``lock_ttl_s``
at most, and a holder stuck longer than ``max_hold_s`` stops renewing (a hung compiler cannot
block the fleet either).

Announcements. Publishing an entry also announces it, in the same step, on the channel
``corral:cc:announce`` (``ANNOUNCE``): the message is ``<key> <spec digest> <sender>``, so
that other replicas can load it before anyone asks them for it (``prefetch``). :meth:`listen`
hands them the announcements of every replica but their own. The constraint itself is stored
beside the entry, under ``corral:spec:<key>`` (``SPEC_PREFIX``, :meth:`spec`), for what a
replica prepares per constraint besides the compiled form; the prefetcher checks it against the
announced digest.

Redis bounds its own size (``maxmemory`` with ``allkeys-lru``): entries carry no expiry.

Redis down or slow never fails or stalls a request for long: every command gives up after
``timeout_s`` and is not retried; a command that cannot reach Redis opens a circuit, and while
it is open the store answers every read as a miss and drops every write without trying. A
background thread PINGs every ``retry_s`` and closes the circuit once Redis answers. (A claim
that timed out may still take its lock once a hung Redis catches up; nobody renews that lock, so
it expires within ``lock_ttl_s`` like a dead holder's.)
:meth:`RedisStore.down` says why it is open, for ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from corral.schema_cache.config import CacheConfig
from corral.schema_cache.flights import CompileCancelled
from corral.schema_cache.stats import CacheStats

log = logging.getLogger(__name__)

PREFIX = "corral:cc:"
ANNOUNCE = PREFIX + "announce"  # the channel on which new entries are announced
SPEC_PREFIX = "corral:spec:"  # an entry's constraint, beside it (not an entry: another prefix)
_LISTEN_POLL_S = 0.5  # how often a listener looks up from the channel (to see it should stop)
_FIRST_POLL_S = 0.005  # a waiter polls this soon first (most compiles take milliseconds) ...
_MAX_POLL_S = 0.1  # ... then backs off to this

# KEYS: entry, lock; ARGV: token, lock ttl (ms). The entry's bytes; or 1: the lock is now
# ours; or 0: another replica holds it.
_CLAIM = """
local entry = redis.call('GET', KEYS[1])
if entry then return entry end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
# KEYS: lock; ARGV: token, ttl (ms). Extends the lock only while it is still ours.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: entry, lock, spec; ARGV: token ('' for none), entry bytes, channel, announcement, spec
# ('' for none). The lock goes first: a SET that Redis refuses (full, with no eviction) must not
# leave waiters waiting for it; the announcement last, once the entry is there to fetch.
_PUBLISH = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[5] ~= '' then redis.call('SET', KEYS[3], ARGV[5]) end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"""
# KEYS: lock; ARGV: token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class FleetBusy(Exception):
    """Another replica held the entry's lock for the whole wait, without publishing it."""


@dataclass(eq=False)
class Lease:
    """This process holds ``key``'s lock: it compiles the entry and publishes it."""

    key: str
    token: str
    renew_until: float  # time.monotonic() past which the lock is no longer renewed


class Claim(NamedTuple):
    """What a claim found: the entry's bytes, or a lease; neither while Redis is down."""

    data: bytes | None
    lease: Lease | None


class RedisStore:
    """The shared tier on the Redis at ``url``; thread-safe; :meth:`close` when done."""

    def __init__(
        self,
        url: str,
        stats: CacheStats,
        *,
        timeout_s: float = 0.25,
        retry_s: float = 5.0,
        lock_ttl_s: float = 5.0,
        max_hold_s: float = 600.0,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.where = _without_password(url)
        self.sender = uuid.uuid4().hex  # names this store's announcements
        self._stats = stats
        self._retry_s = retry_s
        self._ttl_ms = max(1, int(lock_ttl_s * 1000))
        self._max_hold_s = max_hold_s
        # No retries inside redis-py: its default backs off for seconds, on a request's path.
        # Options in the URL's query (socket_timeout=...) override these.
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        self._unreachable = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._failed = redis.RedisError
        scripts = self._client.register_script
        self._claim, self._renew = scripts(_CLAIM), scripts(_RENEW)
        self._publish, self._release = scripts(_PUBLISH), scripts(_RELEASE)
        self._lock = threading.Lock()
        self._down: str | None = None  # why the circuit is open; None while it is closed
        self._leases: set[Lease] = set()
        self._closed = threading.Event()
        self._ping()  # so that down() is right from the start
        self._tender = threading.Thread(target=self._tend, name="corral-redis", daemon=True)
        self._tender.start()

    # -- the shared tier ------------------------------------------------------------------------

    def claim(self, key: str, wait_s: float, cancelled: Callable[[], bool]) -> Claim:
        """The entry, or a lease to compile it; waits (up to ``wait_s``) while another replica
        compiles it. Raises FleetBusy past the wait, CompileCancelled once ``cancelled()``."""
        entry, lock = PREFIX + key, PREFIX + key + ":lock"
        token = uuid.uuid4().hex
        give_up = time.monotonic() + wait_s
        pause = _FIRST_POLL_S
        waited = False
        while True:
            got = self._run(self._claim, keys=[entry, lock], args=[token, self._ttl_ms])
            if got is None:  # down (compile here, alone), or it refused the script: just read
                return Claim(self._run(self._client.get, entry), None)
            if isinstance(got, bytes):
                return Claim(got, None)
            if got == 1:
                lease = Lease(key, token, time.monotonic() + self._max_hold_s)
                with self._lock:
                    self._leases.add(lease)
                return Claim(None, lease)
            if not waited:
                waited = True
                self._stats.inc("redis_lock_waits")
            if cancelled():
                raise CompileCancelled()
            if time.monotonic() + pause > give_up:
                raise FleetBusy(key)
            time.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_S)

    def publish(
        self, key: str, data: bytes, lease: Lease | None, spec_digest: str, spec: bytes = b""
    ) -> None:
        """Store the entry (and ``spec``, the constraint it was compiled from, when given) and,
        in the same step, release ``lease`` (when it is still ours) and announce the entry
        (compiled for ``spec_digest``) to the other replicas."""
        if lease is not None:
            self._forget(lease)
        token = lease.token if lease is not None else ""
        keys = [PREFIX + key, PREFIX + key + ":lock", SPEC_PREFIX + key]
        note = f"{key} {spec_digest} {self.sender}"
        args = [token, data, ANNOUNCE, note, spec]
        done = self._run(self._publish, keys=keys, args=args)
        if done is not None:
            self._stats.inc("redis_writes")

    def get(self, key: str) -> bytes | None:
        """The entry's bytes, or None (no such entry, or Redis down)."""
        return self._run(self._client.get, PREFIX + key)

    def spec(self, key: str) -> bytes | None:
        """The constraint published with the entry, or None (none, evicted, or Redis down)."""
        return self._run(self._client.get, SPEC_PREFIX + key)

    def listen(self, handle: Callable[[str, str], None], stopped: threading.Event) -> None:
        """Call ``handle(key, spec_digest)`` for each entry another replica announces, until
        ``stopped`` is set; returns early, at once while the circuit is open, or once Redis is
        lost (the circuit opens): call again once :meth:`down` is None."""
        if self._down is not None:
            return
        channel = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            channel.subscribe(ANNOUNCE)
            while not stopped.is_set():
                message = channel.get_message(timeout=_LISTEN_POLL_S)
                if message is None or message["type"] != "message":
                    continue
                note = message["data"].decode(errors="replace").split(" ")
                if len(note) == 3 and note[2] != self.sender:  # not ours, nor from another era
                    handle(note[0], note[1])
        except self._unreachable as e:
            if self._down is None:  # the first to find Redis gone counts it
                self._stats.inc("redis_errors")
            self._trip(e)
        except self._failed as e:  # Redis refused to subscribe us (an ACL, ...)
            self._stats.inc("redis_errors")
            log.warning("Redis shared cache at %s: no announcements: %s", self.where, e)
        finally:
            channel.close()

    def release(self, lease: Lease) -> None:
        """Give the lock up without an entry (the compile failed): the next claim compiles."""
        self._forget(lease)
        self._run(self._release, keys=[PREFIX + lease.key + ":lock"], args=[lease.token])

    def discard(self, key: str) -> None:
        """Delete an entry found corrupt or foreign, so that the next claim recompiles it."""
        self._run(self._client.delete, PREFIX + key, SPEC_PREFIX + key)

    def down(self) -> str | None:
        """Why Redis is not being used now (for ``/health``), or None while it is."""
        return self._down

    def close(self) -> None:
        """Stop the background thread, give up the locks still held, close the connections."""
        self._closed.set()
        with self._lock:
            leases, self._leases = list(self._leases), set()
        for lease in leases:
            self.release(lease)
        self._client.close()

    # -- the circuit ----------------------------------------------------------------------------

    def _run(self, command: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``command``'s answer, or None when the circuit is open or the command failed."""
        if self._down is not None:
            return None
        try:
            return command(*args, **kwargs)
        except self._unreachable as e:
            self._stats.inc("redis_errors")
            self._trip(e)
        except self._failed as e:  # Redis answered with an error (out of memory, ...)
            self._stats.inc("redis_errors")
            log.warning("Redis shared cache at %s: %s", self.where, e)
        return None

    def _trip(self, error: BaseException) -> None:
        """Open the circuit (a failed PING while it is open changes nothing)."""
        with self._lock:
            if self._down is not None:
                return
            self._down = (
                f"{self.where} unreachable since {time.strftime('%H:%M:%S UTC', time.gmtime())} "
                f"({str(error) or type(error).__name__}); serving from memory and disk, retrying "
                f"every {self._retry_s:g} s"
            )
        log.warning("shared cache: %s", self._down)

    def _ping(self) -> None:
        try:
            self._client.ping()
        except (self._failed, OSError) as e:
            self._trip(e)
        else:
            if self._down is not None:
                log.warning("shared cache: %s reachable again", self.where)
            self._down = None

    def _tend(self) -> None:
        """Renew the locks held while Redis is up; PING every ``retry_s`` while it is down."""
        renew_every = self._ttl_ms / 3000
        next_ping = 0.0
        while not self._closed.wait(min(renew_every, self._retry_s)):
            if self._down is None:
                self._renew_leases()
            elif time.monotonic() >= next_ping:
                next_ping = time.monotonic() + self._retry_s
                self._ping()

    def _renew_leases(self) -> None:
        now = time.monotonic()
        with self._lock:
            leases = list(self._leases)
        for lease in leases:
            if now > lease.renew_until:  # stuck past any healthy compile: let the lock go
                self._forget(lease)
                continue
            lock = PREFIX + lease.key + ":lock"
            if self._run(self._renew, keys=[lock], args=[lease.token, self._ttl_ms]) == 0:
                self._forget(lease)  # expired anyway (this process stalled): publish still works

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)


def open_shared(config: CacheConfig, stats: CacheStats) -> RedisStore | None:
    """The shared tier ``config`` names (connected, or down and retrying), or None."""
    if config.redis_url is None:
        return None
    return RedisStore(
        config.redis_url,
        stats,
        timeout_s=config.redis_timeout_s,
        retry_s=config.redis_retry_s,
        lock_ttl_s=config.redis_lock_ttl_s,
        # the longest a healthy compile holds its lock: a worker's start-up, then the deadline
        max_hold_s=config.worker_start_timeout_s + config.compile_deadline_s,
    )


def shared_state(store: RedisStore | None) -> str:
    """``off`` (no Redis configured), ``ok``, or ``down`` (served locally meanwhile)."""
    if store is None:
        return "off"
    return "ok" if store.down() is None else "down"


def _without_password(url: str) -> str:
    """The URL to show in logs and ``/health``: any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
