"""What torchloom reads from the environment that plugins read too: the cache directory
and on/off switches. Below every layer (it imports nothing of torchloom), so a plugin gets
it through :mod:`torchloom.api` without loading the compiler."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$TORCHLOOM_CACHE_DIR``, else ``$XDG_CACHE_HOME/torchloom`` (an absolute
    ``XDG_CACHE_HOME`` only, as the XDG base-directory spec says), else
    ``~/.cache/torchloom``."""
    env = os.environ.get("TORCHLOOM_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "torchloom"


def env_flag(name: str, default: bool) -> bool:
    """An on/off environment variable: unset gives ``default``; ``0``, ``false``, ``no``,
    ``off`` and the empty string are off; anything else is on."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def env_choice(name: str, configured: str | None, default: str, choices: tuple[str, ...],
               key: str) -> str:
    """An environment variable ``name`` that overrides a pipeline setting: ``$name`` if set
    (stripped, non-empty), else ``configured``, else ``default``; a value outside
    ``choices`` raises ValueError naming where it came from (``name``, or ``key``, the
    pipeline's)."""
    given = os.environ.get(name, "").strip()
    value = given or configured or default
    if value not in choices:
        raise ValueError(f"{name if given else key} is {value!r}; choose one of "
                         f"{', '.join(choices)}")
    return value
