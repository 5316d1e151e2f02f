"""A real Redis server for the shared-cache tests: Debian's ``redis-server``, installed with
apt-get when missing (CI is a fresh Debian machine running as root), started once per
session on a free loopback port with a temporary directory, and stopped after."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest


def _redis_server() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "redis-server"]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"redis-server is not installed and apt-get could not install it:\n"
                        f"{done.stderr[-2000:]}")
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(directory) -> tuple[subprocess.Popen, str]:
    """A redis-server on a free loopback port, answering: ``(process, "redis://...")``."""
    import redis
    binary = _redis_server()
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(directory), "--save", "", "--appendonly", "no",
                             "--protected-mode", "yes", "--logfile", str(directory / "log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}"
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"redis-server did not start: {(directory / 'log').read_text()}")
            time.sleep(0.05)


def stop_redis(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """``redis://127.0.0.1:<port>`` of a server running for the session."""
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield url
    finally:
        stop_redis(proc)


@pytest.fixture
def private_redis(tmp_path):
    """A server of the test's own: ``(stop, "redis://...")``; ``stop()`` stops it."""
    proc, url = start_redis(tmp_path)
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
