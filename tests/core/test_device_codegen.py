"""``Compiler.device_codegen`` (``PassContext.codegen``): the first of the pipeline's
codegens whose ``takes_device`` takes the compiler's device, what passes shaping groups
for one codegen's forms ask (``fusion.decompose``'s concatenations for ``cpu``)."""

from __future__ import annotations

import pytest

from torchloom.api import Capabilities
from torchloom.codegen.lower import RendererCodegen
from torchloom.tools import Compiler


def _pipeline(codegen):
    return {"pipeline": {"name": "codegens", "codegen": codegen}}


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("TORCHLOOM_TRITON_CPU", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_cpu_groups_go_to_cpu_by_default(no_interpreter):
    compiler = Compiler("default")
    assert compiler.device_codegen == "cpu"
    assert compiler.context().codegen == "cpu"


@pytest.mark.parametrize("switch", ["TORCHLOOM_TRITON_CPU", "TRITON_INTERPRET"])
def test_triton_takes_cpu_groups_with_its_interpreter_on(no_interpreter, monkeypatch,
                                                         switch):
    monkeypatch.setenv(switch, "1")
    assert Compiler("default").device_codegen == "triton"
    assert Compiler(_pipeline(["cpu", "triton"])).device_codegen == "cpu"


def test_cuda_groups_go_to_triton_and_the_last_codegen_takes_every_device(no_interpreter):
    assert Compiler("default", device="cuda").device_codegen == "triton"
    assert Compiler(_pipeline(["cpu"]), device="cuda").device_codegen == "eager"
    assert Compiler(_pipeline("eager")).device_codegen == "eager"


def test_a_codegen_that_cannot_say_leaves_it_unknown(no_interpreter, monkeypatch):
    from torchloom.plugins.loader import PluginSet
    chain = PluginSet.codegen_chain
    unknown = type("Unknown", (), {"name": "unknown"})()  # no takes_device
    monkeypatch.setattr(PluginSet, "codegen_chain",
                        lambda self, preferred: [unknown, *chain(self, preferred)])
    assert Compiler("default").device_codegen is None


def test_a_renderer_takes_the_devices_of_its_capabilities():
    renderer = type("R", (), {"name": "r", "version": "1", "capabilities": Capabilities(
        forms=frozenset({"pointwise"}), dtypes=frozenset({"f32"}), ops=frozenset(),
        devices=frozenset({"cuda"}))})()
    codegen = RendererCodegen(renderer)
    assert codegen.takes_device("cuda") and codegen.takes_device("cuda:1")
    assert not codegen.takes_device("cpu")
