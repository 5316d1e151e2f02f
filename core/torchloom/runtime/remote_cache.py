"""The shared (remote) cache: compiled graphs and kernels kept in Redis for a fleet.

``remote_cache = "redis://HOST:PORT/DB"`` (backend option, pipeline ``[runtime]`` key, or
``TORCHLOOM_REMOTE_CACHE``) names the server; query parameters set the options::

    redis://cache.internal:6379/0?ttl=604800&max_entry_bytes=8388608&timeout=1.0

``ttl`` (seconds an entry lives, 0 for ever; default a week), ``max_entry_bytes`` (larger
entries are neither written nor read; default 8 MiB) and ``timeout`` (seconds for any one
request, connecting included; default 1).

The compile cache and the kernel cache (see :mod:`torchloom.runtime.graph_cache` and
:mod:`torchloom.runtime.cache`) read an entry from here when they do not have it locally,
and write what they compile. A codegen that builds artifacts (the ``cpu`` codegen's shared
libraries) gets its own namespace, ``artifact-<codegen>``, of binary entries through
:func:`offer_artifacts` (see ``with_artifacts`` in :mod:`torchloom.codegen.base`).
Every entry is authenticated with HMAC-SHA256 under the key in
``TORCHLOOM_REMOTE_CACHE_KEY``, over its namespace, its key and its bytes, so an entry
cannot be forged nor moved to another key by anyone without the key; without a key the
remote cache is off (:func:`remote_cache_from` says why, ``explain`` notes it). Anyone with
the key can write entries that every process trusts: it is a shared secret of the fleet.

Nothing here ever fails a compile. An entry that fails its HMAC, is over the size limit or
that the cache using it finds damaged is reported once (a warning naming the key) and
counted in ``errors``; the caller rebuilds and rewrites it. An entry too big to write is
not shared (said once per namespace). A server that is down, refuses,
or does not answer within the timeout is reported once per process and not asked again
by any cache of the process (each graph of a model compiles with its own) for
:data:`RETRY_AFTER` seconds (:class:`ServerHealth`): caching goes on locally, and graphs
compiled meanwhile pay no timeout and log nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import attrs

log = logging.getLogger("torchloom.cache")

ENV_URL = "TORCHLOOM_REMOTE_CACHE"
ENV_KEY = "TORCHLOOM_REMOTE_CACHE_KEY"
MAGIC = b"torchloom-hmac-sha256:"  # then 64 hex digits, a newline, the entry's bytes
PREFIX = "torchloom"  # Redis keys: torchloom:<namespace>:<key>


class RemoteConfigError(ValueError):
    """A remote-cache URL or option that cannot be used (the message says why)."""


@attrs.frozen
class RemoteSettings:
    """Where the shared cache is and its options (parsed from the URL)."""

    url: str  # without the query string
    ttl: int = 7 * 24 * 3600
    max_entry_bytes: int = 8 << 20
    timeout: float = 1.0

    @classmethod
    def parse(cls, url: str) -> RemoteSettings:
        shown = masked(url)  # every message names the URL without its password
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise RemoteConfigError(f"remote_cache {shown!r}: expected redis://HOST:PORT/DB")
        query = parse_qs(parts.query, keep_blank_values=True)
        options: dict[str, Any] = {}
        for name, convert in (("ttl", int), ("max_entry_bytes", int), ("timeout", float)):
            if name in query:
                try:
                    options[name] = convert(query.pop(name)[-1])
                except ValueError:
                    raise RemoteConfigError(f"remote_cache {shown!r}: {name} must be a "
                                            f"number") from None
                if name == "ttl" and options[name] < 0:
                    raise RemoteConfigError(f"remote_cache {shown!r}: ttl must be 0 (for "
                                            f"ever) or a positive number of seconds")
                if name != "ttl" and not options[name] > 0:
                    raise RemoteConfigError(f"remote_cache {shown!r}: {name} must be "
                                            f"positive")
        if query:
            raise RemoteConfigError(f"remote_cache {shown!r}: unknown option(s) "
                                    f"{', '.join(sorted(query))}; known: ttl, "
                                    f"max_entry_bytes, timeout")
        return cls(parts._replace(query="").geturl(), **options)

    @property
    def shown(self) -> str:
        """The URL without its password, for messages."""
        return masked(self.url)


def masked(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``, for messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # (a malformed port, say: show the scheme alone)
        return url.partition("://")[0] + "://***"
    if password is None:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return parts._replace(netloc=user + host).geturl()


def sign(key: bytes, namespace: str, name: str, text: str | bytes) -> bytes:
    """The value stored for ``text`` (or bytes) under ``namespace:name``."""
    payload = text.encode() if isinstance(text, str) else bytes(text)
    mac = hmac.new(key, _signed(namespace, name, payload), hashlib.sha256).hexdigest()
    return MAGIC + mac.encode() + b"\n" + payload


def verify(key: bytes, namespace: str, name: str, value: bytes) -> str:
    """The text of a stored value, or ``ValueError`` saying why it is not authentic."""
    payload = verify_bytes(key, namespace, name, value)
    try:
        return payload.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None


def verify_bytes(key: bytes, namespace: str, name: str, value: bytes) -> bytes:
    """The bytes of a stored value, or ``ValueError`` saying why it is not authentic."""
    if not value.startswith(MAGIC):
        raise ValueError("not a signed torchloom entry")
    mac, sep, payload = value[len(MAGIC):].partition(b"\n")
    if not sep:
        raise ValueError("truncated entry")
    expected = hmac.new(key, _signed(namespace, name, payload), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, expected.encode()):
        raise ValueError("HMAC mismatch (written without the key, or altered)")
    return payload


def _signed(namespace: str, name: str, payload: bytes) -> bytes:
    return f"{namespace}\0{name}\0".encode() + payload


#: seconds a process leaves a server alone after it failed, before asking it again
RETRY_AFTER = 60.0


class ServerHealth:
    """When each server last failed a request, for a whole process: a server that failed
    is not asked again by any :class:`RemoteCache` of the process until ``retry_after``
    seconds have passed (then one request retries it). Knowledge about a machine outside
    the process, kept as a connection pool keeps its connections: :data:`PROCESS_HEALTH`
    is the process's one instance, and tests pass their own."""

    def __init__(self, retry_after: float = RETRY_AFTER, clock: Callable[[], float] = time.monotonic):
        self.retry_after = retry_after
        self._clock = clock
        self._failed: dict[str, float] = {}
        self._lock = threading.Lock()

    def usable(self, url: str) -> bool:
        """Whether ``url`` may be asked now (it never failed, or failed long enough ago)."""
        with self._lock:
            when = self._failed.get(url)
            return when is None or self._clock() - when >= self.retry_after

    def failed(self, url: str) -> bool:
        """Record a failure of ``url``; whether it is news (the server was thought well:
        the caller warns then, and not for a retry that failed again)."""
        with self._lock:
            news = url not in self._failed
            self._failed[url] = self._clock()
            return news

    def answered(self, url: str) -> None:
        with self._lock:
            self._failed.pop(url, None)


PROCESS_HEALTH = ServerHealth()


class RemoteCache:
    """Signed entries in Redis for one compiler's caches (see the module).

    Counters per namespace (``stats(namespace)``): ``hits``, ``misses``, ``stores``,
    ``errors`` (rejected or damaged entries, and the request that found the server
    unusable)."""

    def __init__(self, settings: RemoteSettings, key: bytes, client: Any = None,
                 health: ServerHealth = PROCESS_HEALTH):
        self.settings = settings
        self._key = key
        self._client = client
        self._health = health
        self.available = True
        self._reported: set[str] = set()
        self._counts: dict[tuple[str, str], int] = {}

    def get(self, namespace: str, name: str) -> str | None:
        """The authenticated text under ``namespace:name``, or None (a miss, a rejected
        entry, or no server)."""
        return self._get(namespace, name, verify)

    def get_bytes(self, namespace: str, name: str) -> bytes | None:
        """The authenticated bytes under ``namespace:name``, or None (as :meth:`get`)."""
        return self._get(namespace, name, verify_bytes)

    def _get(self, namespace: str, name: str, check: Callable[..., Any]) -> Any:
        value = self._call(namespace, "GET", f"{PREFIX}:{namespace}:{name}")
        if value is None:
            if self.available:
                self._count(namespace, "misses")
            return None
        try:
            if len(value) > self.settings.max_entry_bytes:
                raise ValueError(f"{len(value)} bytes, over the limit of "
                                 f"{self.settings.max_entry_bytes}")
            payload = check(self._key, namespace, name, value)
        except ValueError as exc:
            self.reject(namespace, name, str(exc))
            return None
        self._count(namespace, "hits")
        return payload

    def put(self, namespace: str, name: str, data: str | bytes) -> None:
        """Write ``data`` (text or bytes) signed under ``namespace:name``; an entry over
        ``max_entry_bytes`` is not shared (said once per namespace)."""
        value = sign(self._key, namespace, name, data)
        if len(value) > self.settings.max_entry_bytes:
            self._count(namespace, "oversized")
            if f"oversized {namespace}" not in self._reported:
                self._reported.add(f"oversized {namespace}")
                log.warning("torchloom: %s:%s:%s is not shared: %d bytes is over "
                            "max_entry_bytes=%d (said once for %s entries; raise it in the "
                            "URL, ?max_entry_bytes=N, to share them)", PREFIX, namespace,
                            name, len(value), self.settings.max_entry_bytes, namespace)
            return
        args = ("SET", f"{PREFIX}:{namespace}:{name}", value)
        if self.settings.ttl:
            args += ("EX", self.settings.ttl)
        if self._call(namespace, *args) is not None:
            self._count(namespace, "stores")

    def reject(self, namespace: str, name: str, why: str) -> None:
        """Count an entry that cannot be used and say so once; the caller rebuilds it
        (and its rewrite replaces the entry)."""
        self._count(namespace, "errors")
        where = f"{PREFIX}:{namespace}:{name}"
        if where not in self._reported:
            self._reported.add(where)
            log.warning("torchloom: remote cache entry %s on %s is rejected (%s); compiling "
                        "it again", where, self.settings.shown, why)

    def stats(self, namespace: str) -> dict[str, int]:
        return {c: self._counts.get((namespace, c), 0)
                for c in ("hits", "misses", "stores", "errors", "oversized")}

    def total(self, prefix: str, counter: str) -> int:
        """``counter`` added up over the namespaces starting with ``prefix``."""
        return sum(n for (ns, c), n in self._counts.items()
                   if c == counter and ns.startswith(prefix))

    def _count(self, namespace: str, counter: str) -> None:
        self._counts[namespace, counter] = self._counts.get((namespace, counter), 0) + 1

    def _call(self, namespace: str, *args) -> Any:
        if not self.available:
            return None
        if not self._health.usable(self.settings.url):  # failed lately, for another cache
            self.available = False
            return None
        try:
            if self._client is None:
                import redis
                self._client = redis.Redis.from_url(
                    self.settings.url, socket_timeout=self.settings.timeout,
                    socket_connect_timeout=self.settings.timeout)
            result = self._client.execute_command(*args)
        except Exception as exc:  # any failure of the server or client: go on locally
            self.available = False
            self._count(namespace, "errors")
            news = self._health.failed(self.settings.url)
            (log.warning if news else log.info)(
                "torchloom: remote cache %s is unusable (%s: %s); caching locally only, "
                "asking it again in %.0f s", self.settings.shown, type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "", self._health.retry_after)
            return None
        self._health.answered(self.settings.url)
        return result


@attrs.frozen
class RemoteArtifacts:
    """A codegen's :class:`~torchloom.codegen.base.ArtifactStore`: binary entries of the
    shared cache in one namespace (authenticated and size-limited as every entry)."""

    remote: RemoteCache
    namespace: str

    def get(self, name: str) -> bytes | None:
        return self.remote.get_bytes(self.namespace, name)

    def put(self, name: str, data: bytes) -> None:
        self.remote.put(self.namespace, name, data)

    def reject(self, name: str, why: str) -> None:
        self.remote.reject(self.namespace, name, why)


def offer_artifacts(codegens: Sequence[Any], remote: RemoteCache | None,
                    bound: dict[str, Any]) -> list[Any]:
    """``codegens``, each that has ``with_artifacts`` replaced by its copy sharing built
    artifacts through ``remote`` (namespace ``artifact-<name>``), made once and kept in
    ``bound`` (by codegen name). A ``with_artifacts`` that raises is reported once in
    ``bound``'s life and the codegen builds for itself."""
    if remote is None:
        return list(codegens)
    chain = []
    for cg in codegens:
        offer = getattr(cg, "with_artifacts", None)
        if callable(offer) and cg.name not in bound:
            try:
                bound[cg.name] = offer(RemoteArtifacts(remote, f"artifact-{cg.name}"))
            except Exception as exc:  # a plugin's bug costs the sharing, not the compile
                log.warning("torchloom: codegen %r cannot share what it builds (%s: %s); it "
                            "builds everything itself", cg.name, type(exc).__name__, exc)
                bound[cg.name] = cg
        chain.append(bound.get(cg.name, cg) if callable(offer) else cg)
    return chain


def remote_cache_from(url: str | None, environ: Mapping[str, str] | None = None
                      ) -> tuple[RemoteCache | None, str | None]:
    """The remote cache ``url`` (or, when None, ``TORCHLOOM_REMOTE_CACHE``) asks for, and
    a note saying why it is off when one is named but cannot be used (no key, no
    ``redis`` package); ``(None, None)`` when none is named. A malformed URL raises
    :class:`RemoteConfigError`."""
    environ = os.environ if environ is None else environ
    url = url or environ.get(ENV_URL) or None
    if url is None:
        return None, None
    settings = RemoteSettings.parse(url)
    key = environ.get(ENV_KEY, "")
    if not key:
        return None, (f"remote cache {settings.shown} is off: {ENV_KEY} is not set (shared "
                      f"entries are authenticated with HMAC-SHA256 under that key)")
    try:
        import redis  # noqa: F401
    except ImportError:
        return None, (f"remote cache {settings.shown} is off: the redis package is not "
                      f"installed (pip install 'torchloom[redis]')")
    return RemoteCache(settings, key.encode()), None


__all__ = ["RemoteArtifacts", "RemoteCache", "RemoteSettings", "RemoteConfigError",
           "offer_artifacts", "remote_cache_from", "sign", "verify", "verify_bytes", "ENV_URL",
           "ENV_KEY"]
