"""A real Redis server for the shared-cache tests (see
:mod:`torchloom.testing.redis_server`: Debian's ``redis-server``, installed with apt-get
when missing), started once per session on a free loopback port with a temporary
directory, and stopped after."""

from __future__ import annotations

import pytest

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
