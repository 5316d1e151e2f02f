"""The example codegen imported from its tree, for the tests of the core's lowering."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from torchloom.tools import load_plugins

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third_party_codegen" / "src"


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
