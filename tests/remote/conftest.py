"""A real Redis server for the shared-cache tests (see
:mod:`torchloom.testing.redis_server`: Debian's ``redis-server``, installed with apt-get
when missing), started once per session on a free loopback port with a temporary
directory, and stopped after."""

from __future__ import annotations

import pytest
from remote_children import KEY, WORKLOAD

from torchloom.testing.redis_server import RedisUnavailable, start_redis, stop_redis


def _start(directory):
    try:
        return start_redis(directory)
    except RedisUnavailable as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """``redis://127.0.0.1:<port>`` of a server running for the session."""
    proc, url = _start(tmp_path_factory.mktemp("redis"))
    try:
        yield url
    finally:
        stop_redis(proc)


@pytest.fixture
def private_redis(tmp_path):
    """A server of the test's own: ``(stop, "redis://...")``; ``stop()`` stops it."""
    proc, url = _start(tmp_path)
    try:
        yield (lambda: stop_redis(proc)), url
    finally:
        stop_redis(proc)


@pytest.fixture
def redis_url(redis_server):
    """A URL to an emptied database of the session's server (each test starts clean)."""
    import redis
    url = f"{redis_server}/0"
    redis.Redis.from_url(url).flushdb()
    return url


@pytest.fixture
def redis_client(redis_url):
    import redis
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def workload(tmp_path):
    """A small model's workload file (a forward and a backward graph, on the cpu)."""
    path = tmp_path / "work.py"
    path.write_text(WORKLOAD)
    return path


@pytest.fixture
def fleet(monkeypatch, redis_url, tmp_path):
    """Point this process at the shared cache with the fleet's key; returns a function
    giving a fresh, empty local cache directory (a new machine)."""
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", redis_url)
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE_KEY", KEY)
    machines = iter(range(100))

    def new_machine():
        path = tmp_path / f"machine{next(machines)}"
        monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(path))
        return path
    return new_machine
