"""Step 1 of ``device_check.sh``: make ``PYTHON`` import this checkout's torchloom and
plugins, installing them without a network only when needed.

The install is current when ``torchloom`` and every plugin's entry-point module resolve to
files of this checkout and each distribution declares the entry points its
``pyproject.toml`` declares (editable installs pick up code changes by themselves; a new
plugin, a renamed entry point or an install from another checkout makes it stale). When
stale: ``pip install --no-deps --no-build-isolation -e . -e plugins/<each>`` into
``PYTHON``; when pip may not write there, into a virtualenv with
``--system-site-packages`` (the image's torch, triton and test tools stay visible).

Prints the Python to run the driver with on its last line of stdout; writes what it did to
``$OUT/install.json`` (and pip's output to ``$OUT/install.txt``). Standard library only:
it runs before anything is known to import.

    python benchmarks/gpu/device_check_install.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: run by the Python being checked: where each module resolves and which entry points
#: each distribution declares (nothing is imported: ``find_spec`` of a top-level name)
_PROBE = r"""
import importlib.metadata as md, importlib.util, json, sys
names, modules = json.loads(sys.argv[1])
found = {"modules": {}, "dists": {}}
for module in modules:
    try:
        spec = importlib.util.find_spec(module)
        found["modules"][module] = spec.origin if spec else None
    except Exception as exc:
        found["modules"][module] = None
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        found["dists"][name] = None
        continue
    found["dists"][name] = sorted([ep.group, ep.name, ep.value] for ep in dist.entry_points)
print(json.dumps(found))
"""


def _project(pyproject: Path) -> tuple[str, list[list[str]]]:
    """(distribution name, sorted [group, name, value] entry points) of a pyproject.toml."""
    text = pyproject.read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10: the two tables this needs, read by hand
        name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M).group(1)
        eps = []
        for group, body in re.findall(r'^\[project\.entry-points\.([\w.]+)\]\n((?:[^\[].*\n?)*)',
                                      text, re.M):
            eps += [[group, k, v] for k, v in re.findall(r'^(\w+)\s*=\s*"([^"]+)"', body, re.M)]
        return name, sorted(eps)
    project = tomllib.loads(text)["project"]
    eps = [[group, k, v] for group, table in project.get("entry-points", {}).items()
           for k, v in table.items()]
    return project["name"], sorted(eps)


def wanted() -> dict[str, tuple[Path, list[list[str]]]]:
    """distribution name -> (its folder, the entry points it must declare)."""
    folders = [ROOT] + sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml"))
    out = {}
    for folder in folders:
        name, eps = _project(folder / "pyproject.toml")
        out[name] = (folder, eps)
    return out


def stale_reasons(python: str) -> list[str]:
    """Why ``python`` does not run this checkout's install (empty: it does)."""
    want = wanted()
    modules = {"torchloom": ROOT / "core"}
    for folder, eps in want.values():
        for group, _, value in eps:
            if group == "torchloom":
                modules[value.split(":")[0].split(".")[0]] = folder
    probe = subprocess.run([python, "-c", _PROBE, json.dumps([sorted(want), sorted(modules)])],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return [f"{python} cannot run the probe: {probe.stderr.strip()[-500:]}"]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    reasons = []
    for module, folder in modules.items():
        origin = found["modules"].get(module)
        if origin is None:
            reasons.append(f"module {module} is not importable")
        elif not Path(origin).resolve().is_relative_to(folder.resolve()):
            reasons.append(f"module {module} comes from {origin}, not {folder}")
    for name, (_, eps) in want.items():
        have = found["dists"].get(name)
        if have is None:
            reasons.append(f"distribution {name} is not installed")
        elif sorted(ep for ep in have if ep[0] in {g for g, _, _ in eps}) != eps:
            reasons.append(f"distribution {name} declares other entry points than its "
                           f"pyproject.toml ([project.entry-points.*])")
    return reasons


def pip_install(python: str, log) -> bool:
    targets = []
    for folder, _ in wanted().values():
        targets += ["-e", str(folder)]
    cmd = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
           "--no-index", "--disable-pip-version-check", *targets]
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=300, cwd=ROOT)
    return done.returncode == 0


def ensure(python: str, out: Path) -> dict:
    """Install when stale; return what was done (``python``: the one to use)."""
    t0 = time.monotonic()
    record = {"python": python, "action": "none", "reasons": stale_reasons(python)}
    if record["reasons"]:
        with open(out / "install.txt", "a") as log:
            ok = pip_install(python, log) and not stale_reasons(python)
            if ok:
                record["action"] = "pip install -e (into the given python)"
            else:  # not writable (or externally managed): a venv over the image's packages
                venv = Path(os.environ.get("DEVICE_CHECK_VENV")
                            or Path(tempfile.gettempdir()) / "torchloom-device-venv")
                if not (venv / "bin" / "python").exists():
                    subprocess.run([python, "-m", "venv", "--system-site-packages", str(venv)],
                                   stdout=log, stderr=subprocess.STDOUT, check=False)
                python = str(venv / "bin" / "python")
                ok = pip_install(python, log)
                left = stale_reasons(python)
                record.update(python=python, action=f"pip install -e (into venv {venv})")
                if not ok or left:
                    record["error"] = ("install failed (see install.txt): "
                                       + "; ".join(left or ["pip failed"]))
    record["seconds"] = round(time.monotonic() - t0, 2)
    return record


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "device_check_out")
    out.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("PYTHON") or sys.executable
    try:
        record = ensure(python, out)
    except Exception as exc:  # recorded, and the driver still runs (it says what failed)
        record = {"python": python, "action": "failed", "error": f"{type(exc).__name__}: {exc}"}
    (out / "install.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"[device_check] install: {record['action']}"
          + (f" ({'; '.join(record['reasons'])})" if record.get("reasons") else "")
          + (f"; ERROR {record['error']}" if record.get("error") else ""), file=sys.stderr)
    print(record["python"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
