"""The example codegen imported from its tree, for the tests of the core's lowering
(``scalar_c``), and installed as pip would install it, found through its entry point
(``plugins``)."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

from torchloom.compiler import Compiler
from torchloom.tools import load_plugins

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "third_party_codegen"
EXAMPLE = PROJECT / "src"


@pytest.fixture(scope="module")
def scalar_c(tmp_path_factory):
    """(the example's renderer class, the registry), the example imported from its tree."""
    sys.path.insert(0, str(EXAMPLE))
    mp = pytest.MonkeyPatch()
    mp.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        from torchloom_scalar_c.renderer import ScalarC
        yield ScalarC, load_plugins().registry
    finally:
        mp.undo()
        sys.path.remove(str(EXAMPLE))
        for name in [m for m in sys.modules if m.startswith("torchloom_scalar_c")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """Plugins loaded with the example installed as pip would install it."""
    site = tmp_path_factory.mktemp("site")
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    eps = "".join(f"{k} = {v}\n" for k, v in project["entry-points"]["torchloom"].items())
    (info / "entry_points.txt").write_text(f"[torchloom]\n{eps}")
    paths = [str(site), str(EXAMPLE)]
    sys.path[:0] = paths
    cache = os.environ.get("TORCHLOOM_CACHE_DIR")
    os.environ["TORCHLOOM_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    try:
        yield load_plugins()
    finally:
        for p in paths:
            sys.path.remove(p)
        if cache is None:
            del os.environ["TORCHLOOM_CACHE_DIR"]
        else:
            os.environ["TORCHLOOM_CACHE_DIR"] = cache
        for name in [m for m in sys.modules if m.startswith("torchloom_scalar_c")]:
            del sys.modules[name]


@pytest.fixture
def scalar_c_compiler(tmp_path) -> Compiler:
    """A compiler whose pipeline's codegen is scalar_c (the default pipeline's passes)."""
    pipeline = tmp_path / "scalar_c.toml"
    pipeline.write_text('[pipeline]\nname = "scalar-c"\nextends = "default"\n'
                        'codegen = ["scalar_c"]\n')
    return Compiler(str(pipeline), cache_dir=tmp_path, compile_cache=False, strict=True)
