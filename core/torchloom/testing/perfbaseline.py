"""Perf-gate baselines across commits, kept in pytest-benchmark's storage folder.

``--perf-baseline=save`` appends each gate's run (its samples, verdict and interval, the
commit and time) to ``<benchmark-storage>/<machine id>/perfgate/<gate>.json``, the machine
id being pytest-benchmark's; ``--perf-baseline=compare`` also tests the candidate's samples
against the last saved run's (two independent samples: :func:`perfstats.shift_interval`)
and fails a significant slowdown larger than ``max_regression``. ``torchloom perf-history``
prints what the files hold. The files are JSON, read back as data only.
"""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

from torchloom.testing.perfstats import Interval, shift_interval

MODES = ("off", "save", "compare")
FORMAT = 1


def storage_root(storage: str | None) -> Path:
    """The folder of pytest-benchmark's ``--benchmark-storage`` (``file://`` only)."""
    storage = storage or "file://./.benchmarks"
    if "://" in storage and not storage.startswith("file://"):
        raise ValueError(f"--benchmark-storage {storage!r}: perf-gate baselines are kept in "
                         f"files only (file://PATH)")
    return Path(storage.removeprefix("file://"))


def machine_id() -> str:
    from pytest_benchmark.utils import get_machine_id
    return get_machine_id()


def gate_file(root: Path, machine: str, gate: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", gate).strip("_")[:180]
    return root / machine / "perfgate" / f"{safe}.json"


def load_runs(path: Path) -> list[dict[str, Any]]:
    """The runs saved in a gate file, oldest first (none when there is no file)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a perf-gate baseline file (format {FORMAT})")
    runs = data.get("runs", [])
    if not all(isinstance(r, dict) and isinstance(r.get("candidate"), list) for r in runs):
        raise ValueError(f"{path}: a run without candidate samples")
    return runs


def run_record(gate: str, result: dict[str, Any], candidate: list[float],
               baseline: list[float]) -> dict[str, Any]:
    return {"gate": gate, "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "commit": _commit(), **result, "candidate": candidate, "baseline": baseline}


def save_run(path: Path, gate: str, record: dict[str, Any]) -> None:
    runs = load_runs(path) + [record]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, "gate": gate, "runs": runs}, indent=1))


def compare(saved: dict[str, Any], candidate: list[float], *, level: float,
            max_regression: float) -> tuple[Interval, bool]:
    """(the candidate's speed now relative to the saved run, whether that is a
    significant slowdown beyond ``max_regression``: the interval's high end below
    1 / (1 + max_regression))."""
    iv = shift_interval(saved["candidate"], candidate, level=level)
    return iv, iv.high < 1 / (1 + max_regression)


def _commit() -> str | None:
    try:
        from pytest_benchmark.utils import get_commit_info
        info = get_commit_info()
    except Exception:  # no git, not a repository: the run is saved without a commit
        return None
    return info.get("id")


def history(root: Path, machine: str | None = None, match: str = "") -> list[dict[str, Any]]:
    """Every saved gate under ``root`` (one machine id, or all), with its runs and, for
    each run after the first, its candidate's speed relative to the run before."""
    gates = []
    machines = [root / machine] if machine else sorted(p for p in root.glob("*") if p.is_dir())
    for folder in machines:
        for path in sorted((folder / "perfgate").glob("*.json")):
            runs = load_runs(path)
            if not runs or match not in runs[-1].get("gate", path.stem):
                continue
            rows = []
            for before, run in zip([None] + runs[:-1], runs):
                change = (None if before is None else
                          shift_interval(before["candidate"], run["candidate"]))
                rows.append({**{k: v for k, v in run.items()
                                if k not in ("candidate", "baseline")},
                             "vs_previous": None if change is None else
                             [change.speedup, change.low, change.high]})
            gates.append({"machine": folder.name, "gate": runs[-1].get("gate", path.stem),
                          "file": str(path), "runs": rows})
    return gates


def format_history(gates: list[dict[str, Any]]) -> str:
    if not gates:
        return "no saved perf-gate runs (pytest --perf-baseline=save writes them)"
    lines = []
    for g in gates:
        lines.append(f"{g['gate']}  [{g['machine']}]")
        for r in g["runs"]:
            change = r["vs_previous"]
            vs = ("" if change is None else
                  f"; candidate {change[0]:.3f}x the run before [{change[1]:.3f}, "
                  f"{change[2]:.3f}]")
            lines.append(f"  {r['datetime'][:19]}  {(r.get('commit') or '-')[:10]:<10}  "
                         f"{r['verdict']:<12} {r['speedup']:.3f}x [{r['low']:.3f}, "
                         f"{r['high']:.3f}] over {r['rounds']} rounds{vs}")
    return "\n".join(lines)
