"""``torchloom perf-history``: what ``pytest --perf-baseline=save`` kept of each perf gate,
run by run (commit, verdict, speed-up and interval, rounds, and the candidate's speed
relative to the run before with its interval). Registered on the CLI by
:func:`add_perf_history_parser`; the files are :mod:`torchloom.testing.perfbaseline`'s."""

from __future__ import annotations

import json
from pathlib import Path

from torchloom.errors import TorchloomError


class PerfHistoryError(TorchloomError):
    """A storage folder or baseline file that cannot be read."""


def add_perf_history_parser(sub) -> None:
    """Register ``perf-history`` on the CLI's subcommand parsers."""
    p = sub.add_parser("perf-history", help="show perf gates' saved runs "
                                            "(pytest --perf-baseline=save)")
    p.add_argument("gate", nargs="?", default="",
                   help="only gates whose id contains this text (a test name)")
    p.add_argument("--storage", default=".benchmarks", metavar="DIR",
                   help="pytest-benchmark's storage folder (default: %(default)s)")
    p.add_argument("--machine", default=None,
                   help="one machine id (a folder under the storage; default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def perf_history(args) -> tuple[list[dict], str]:
    """(the saved gates with their runs, the text the command prints)."""
    from torchloom.testing.perfbaseline import format_history, history, storage_root
    try:
        root = storage_root(args.storage if "://" in args.storage
                            else f"file://{args.storage}")
    except ValueError as exc:
        raise PerfHistoryError(str(exc)) from None
    if not Path(root).is_dir():
        raise PerfHistoryError(f"--storage {args.storage}: no such folder (pytest "
                               f"--perf-baseline=save writes one)")
    try:
        gates = history(Path(root), args.machine, args.gate)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise PerfHistoryError(f"{exc}") from None
    return gates, format_history(gates)
