"""Fake installed plugins for the pass-framework tests (no test functions here).

``fake_site`` writes plugin modules and a ``.dist-info`` (METADATA + entry_points.txt)
into a temporary directory put on ``sys.path``, so ``importlib.metadata`` discovers them
exactly as it discovers a pip-installed plugin: ``load_plugins()`` and the CLI see them
without being told. ``FAKE_PASSES`` is a plugin module whose passes cover every case the
pipeline builder and the pass manager must handle.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import sys
import textwrap
from pathlib import Path

import pytest

from torchloom.ir.text import parse_graph

FAKE_PASSES = '''
from typing import ClassVar, Literal

import attrs

from torchloom.api import Pass, PassResult, TensorType, hookimpl


@attrs.frozen
class Tunable(Pass):
    """Changes nothing; has an option of every type a pipeline file can set."""
    name: ClassVar[str] = "fake.tunable"
    limit: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    scale: float = 1.0
    enabled: bool = True
    mode: Literal["fast", "exact"] = "fast"
    ops: tuple[str, ...] = ()

    def run(self, graph, ctx):
        return PassResult(False, {"limit": self.limit})


@attrs.frozen
class NeedsTunable(Pass):
    """Requires fake.tunable earlier in the pipeline."""
    name: ClassVar[str] = "fake.needs-tunable"
    requires: ClassVar[tuple[str, ...]] = ("fake.tunable",)

    def run(self, graph, ctx):
        return PassResult(False)


@attrs.frozen
class AfterCse(Pass):
    """Must come after cse when both are present."""
    name: ClassVar[str] = "fake.after-cse"
    after: ClassVar[tuple[str, ...]] = ("cse",)

    def run(self, graph, ctx):
        return PassResult(False)


@attrs.frozen
class Flipper(Pass):
    """Swaps the operands of every aten.add.Tensor: changes the graph on every run."""
    name: ClassVar[str] = "fake.flipper"

    def run(self, graph, ctx):
        swapped = 0
        for node in graph.nodes:
            if node.op == "aten.add.Tensor" and len(node.inputs) == 2:
                node.inputs.reverse()
                swapped += 1
        return PassResult(swapped > 0, {"swapped": swapped})


@attrs.frozen
class Boom(Pass):
    """Edits the graph three ways (new node, new output, changed op), then raises."""
    name: ClassVar[str] = "fake.boom"

    def run(self, graph, ctx):
        last = graph.last
        graph.create("aten.neg.default", [graph.inputs[0]], [graph.inputs[0].type],
                     before=graph.first)
        graph.outputs[0] = graph.inputs[0]
        last.op = "aten.cos.default"
        raise RuntimeError("boom: the pass gave up half way")


@attrs.frozen
class Corrupt(Pass):
    """Leaves a node that reads a value defined after it: the verifier must reject it."""
    name: ClassVar[str] = "fake.corrupt"

    def run(self, graph, ctx):
        last = graph.last.output
        graph.create("aten.neg.default", [last], [last.type], before=graph.first)
        return PassResult(True)


@attrs.frozen
class Retype(Pass):
    """Declares the last result f64 where it computes f32: wiring intact, types wrong (only
    the full verifier, not the ordering check of verify = "off", rejects it)."""
    name: ClassVar[str] = "fake.retype"

    def run(self, graph, ctx):
        out = graph.last.output
        out.type = TensorType.make(list(out.type.shape), "f64")
        return PassResult(True)


@hookimpl
def torchloom_passes():
    return [Tunable, NeedsTunable, AfterCse, Flipper, Boom, Corrupt, Retype]
'''

#: a small graph every fake pass can run on
SMALL_IR = """\
graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
  %a = aten.add.Tensor(%x, %y) : f32[4, 8]
  %e = aten.exp.default(%a) : f32[4, 8]
  return %e
}
"""


def small_graph():
    return parse_graph(SMALL_IR)


class FakeSite:
    """A directory on ``sys.path`` holding fake installed distributions."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: list[str] = []

    def add(self, dist: str, *, version: str = "1.0", modules: dict[str, str] | None = None,
            entry_points: dict[str, str] | None = None) -> Path:
        """Write ``modules`` (name -> source) and a dist-info naming ``entry_points``
        (entry point name -> module) in the ``torchloom`` group."""
        for name, source in (modules or {}).items():
            (self.root / f"{name}.py").write_text(textwrap.dedent(source))
            self.modules.append(name)
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")
        eps = "".join(f"{k} = {v}\n" for k, v in (entry_points or {}).items())
        (info / "entry_points.txt").write_text(f"[torchloom]\n{eps}")
        importlib.invalidate_caches()
        return info

    def entry_points(self) -> list[md.EntryPoint]:
        """Only the fake distributions' entry points (bound to their distributions)."""
        return [ep for d in md.distributions(path=[str(self.root)])
                for ep in d.entry_points if ep.group == "torchloom"]


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv("TORCHLOOM_DISABLE_PLUGINS", raising=False)
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    site = FakeSite(root)
    yield site
    for name in site.modules:
        sys.modules.pop(name, None)


@pytest.fixture
def fake_plugins(fake_site):
    """The core built-ins plus the ``fake-passes`` distribution (entry point ``fake``)."""
    from torchloom.plugins.loader import load_plugins
    fake_site.add("fake-passes", version="1.2.3", modules={"tl_fake_passes": FAKE_PASSES},
                  entry_points={"fake": "tl_fake_passes"})
    return load_plugins(entry_points=fake_site.entry_points())
