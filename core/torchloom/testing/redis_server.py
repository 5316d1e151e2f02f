"""A throw-away Redis server for tests and benchmarks of the shared cache: Debian's
``redis-server``, installed with apt-get when missing (CI is a fresh Debian machine
running as root), started on a free loopback port with its own directory, no persistence.

    proc, url = start_redis(tmp_dir)   # "redis://127.0.0.1:<port>", answering
    ...
    stop_redis(proc)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


class RedisUnavailable(RuntimeError):
    """redis-server could not be installed or started (the message says why)."""


def redis_server_binary() -> str:
    """The path of ``redis-server``, installing Debian's package when it is missing."""
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
            raise RedisUnavailable(f"redis-server is not installed and apt-get could not "
                                   f"install it:\n{done.stderr[-2000:]}")
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(directory: str | Path, timeout: float = 20.0) -> tuple[subprocess.Popen, str]:
    """A redis-server on a free loopback port, answering: ``(process, "redis://...")``."""
    try:
        import redis  # the optional extra torchloom[redis]
    except ImportError as exc:
        raise RuntimeError("start_redis needs the redis client: pip install 'torchloom[redis]'") \
            from exc
    directory = Path(directory)
    port = free_port()
    proc = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(directory), "--save", "", "--appendonly", "no",
                             "--protected-mode", "yes", "--logfile", str(directory / "log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}"
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log = directory / "log"
                raise RedisUnavailable(f"redis-server did not start: "
                                       f"{log.read_text() if log.exists() else ''}") from None
            time.sleep(0.05)


def stop_redis(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


__all__ = ["start_redis", "stop_redis", "redis_server_binary", "free_port",
           "RedisUnavailable"]
