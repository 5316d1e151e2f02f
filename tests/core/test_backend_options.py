"""Backend options: unknown keys and modes get a did-you-mean, ``mode`` changes what
it says (reduce-overhead: CUDA graphs; max-autotune: each codegen's for_mode copy), and
a pipeline may be given inline as a dict (written as TOML and checked like a file)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.compiler.mode import MODES, mode_codegens
from torchloom.compiler import Compiler
from torchloom.errors import PipelineError
from torchloom.backend import torchloom_backend
from torchloom.passes.pipeline_dict import pipeline_toml

try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib

INLINE = {"pipeline": {"name": "inline", "codegen": "eager", "verify": "each"},
          "pass": [{"name": "cse"}, {"name": "dce"}]}


def _f(x):
    return (x.exp() + x.exp()).relu() * 2


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _gm():
    return torch.fx.symbolic_trace(_f), [torch.randn(4, 8)]


def test_unknown_option_keys_get_a_did_you_mean():
    gm, inputs = _gm()
    with pytest.raises(PipelineError) as err:
        torchloom_backend(gm, inputs, options={"pipline": "none", "zzz": 1})
    assert "'pipline' (did you mean 'pipeline'?)" in str(err.value)
    assert "'zzz'" in str(err.value) and "known: pipeline" in str(err.value)


def test_unknown_mode_gets_a_did_you_mean():
    gm, inputs = _gm()
    with pytest.raises(PipelineError, match=r"unknown mode 'reduce-overheads'.*did you mean "
                                            r"'reduce-overhead'\?"):
        torchloom_backend(gm, inputs, mode="reduce-overheads")
    with pytest.raises(PipelineError, match="disagree"):
        torchloom_backend(gm, inputs, options={"mode": "max-autotune"}, mode="reduce-overhead")


@pytest.mark.parametrize("mode, cudagraphs", [(None, False), ("default", False),
                                              ("reduce-overhead", True),
                                              ("max-autotune", True),
                                              ("max-autotune-no-cudagraphs", False)])
def test_modes_turn_cuda_graphs_on(mode, cudagraphs):
    compiler = Compiler("none", mode=mode)
    assert ("cudagraphs" in compiler.pipeline.runtime) is cudagraphs
    assert compiler.mode == (mode or "default")


def test_reduce_overhead_through_torch_compile_asks_every_graph_quietly(caplog):
    x = torch.randn(4, 8)
    with caplog.at_level(logging.INFO, logger="torchloom"):
        got = torch.compile(_f, backend="torchloom", mode="reduce-overhead")(x)
    torch.testing.assert_close(got, _f(x))
    # the cudagraphs wrapper was asked (on this CPU it declines, and says why), at INFO: the
    # mode turned it on, so a CPU graph without CUDA graphs is no warning (as Inductor's)
    said = [r for r in caplog.records if "runs without CUDA graphs" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_graph_no_wrapper_takes_keeps_its_donation(tmp_path, caplog, mode):
    """A wrapper that declines a graph is not called and the plan donates as without it;
    where the pipeline (not the mode) turned it on, the decline is a warning."""
    from torchloom.api import parse_graph
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[pipeline]\nname = "p"\n[runtime]\ncudagraphs = true\n'
                        if mode is None else '[pipeline]\nname = "p"\n')
    compiler = Compiler(pipeline, mode=mode, cache_dir=tmp_path, compile_cache=False)
    assert "cudagraphs" in compiler.pipeline.runtime
    graph = parse_graph("graph @g(%x: f32[4]) {\n  %y = aten.exp.default(%x) : f32[4]\n"
                        "  return %y\n}")
    with caplog.at_level(logging.INFO, logger="torchloom"):
        comp = compiler.compile_graph(graph, donated=[0], boxed=True)
    said = [r.levelno for r in caplog.records if "runs without CUDA graphs" in r.getMessage()]
    assert sorted(said) == ([logging.INFO, logging.WARNING] if mode is None else [logging.INFO])
    assert any("runs without CUDA graphs" in n for n in comp.notes)
    assert comp.fn is comp.compiled.plan.fn  # not wrapped
    x = torch.randn(4)
    args = [x]
    assert torch.equal(comp.boxed_fn(args)[0], x.exp())
    assert args == []  # the plan's own boxed entry, which drops inputs as it goes


def test_max_autotune_uses_each_codegens_for_mode_copy():
    class Wide:
        name = "wide"

        def for_mode(self, mode):
            return ("copy", mode)

    class Plain:
        name = "plain"

    class Declines:
        name = "declines"

        def for_mode(self, mode):
            return None

    chain = [Wide(), Plain(), d := Declines()]
    for mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        got = mode_codegens(chain, mode)
        assert got[0] == ("copy", mode) and got[1] is chain[1] and got[2] is d
    for mode in ("default", "reduce-overhead"):
        assert mode_codegens(chain, mode) == chain
    assert set(MODES) == {"default", "reduce-overhead", "max-autotune",
                          "max-autotune-no-cudagraphs"}


def test_a_pipeline_given_inline_as_a_dict():
    x = torch.randn(4, 8)
    got = torch.compile(_f, backend="torchloom", options={"pipeline": INLINE})(x)
    torch.testing.assert_close(got, _f(x))
    compiler = Compiler(INLINE)
    assert compiler.pipeline.name == "inline"
    assert [s.name for s in compiler.pipeline.flat_steps()] == ["cse", "dce"]
    assert compiler.pipeline.source == "<inline pipeline>"
    assert tomllib.loads(compiler.pipeline.text) == INLINE  # what a reproducer keeps


def test_an_inline_pipeline_is_checked_like_a_file():
    with pytest.raises(PipelineError, match=r"<inline pipeline>:\d+: unknown pass 'csee'; "
                                            r"did you mean 'cse'\?"):
        Compiler({"pipeline": {"name": "x"}, "pass": [{"name": "csee"}]})
    with pytest.raises(PipelineError, match=r"pass\.name = None"):
        Compiler({"pass": [{"name": None}]})
    with pytest.raises(PipelineError, match="must be a dict"):
        pipeline_toml(["cse"])


_scalars = (st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=8)
            | st.floats(allow_nan=False))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
_tables = st.dictionaries(st.text(max_size=6), _values, max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _scalars | _tables
                       | st.lists(_tables, min_size=1, max_size=3), max_size=4))
def test_the_toml_of_any_dict_reads_back_as_the_dict(data):
    back = tomllib.loads(pipeline_toml(data))
    assert _same(back, data)


def _same(a, b) -> bool:
    if isinstance(b, float):
        return isinstance(a, float) and (a == b or (math.isinf(a) and a == b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, (list, tuple)):
        return isinstance(a, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_a_wrapper_says_which_modes_turn_it_on():
    """The core names no wrapper: ``modes`` on the wrapper decides (as cudagraphs' does)."""
    import types

    import attrs

    from torchloom.api import hookimpl
    from torchloom.tools import load_plugins

    @attrs.frozen
    class TracingOptions:
        level: int = 1

    class Tracing:
        name = "tracing"
        Options = TracingOptions
        modes = ("max-autotune-no-cudagraphs",)

        def wrap(self, fn, options, ctx, compiled):
            return fn

    class Idle(Tracing):
        name = "idle"
        modes = ()

    module = types.ModuleType("wrappers_plugin")
    module.torchloom_runtime_wrappers = hookimpl(lambda: [Tracing(), Idle()])
    plugins = load_plugins(extra=[("wrappers", module, "wrappers", "1")])
    on = Compiler("none", plugins=plugins, mode="max-autotune-no-cudagraphs").pipeline.runtime
    assert set(on) == {"tracing"} and on["tracing"] == TracingOptions()
    assert "tracing" not in Compiler("none", plugins=plugins, mode="default").pipeline.runtime
    configured = Compiler({"runtime": {"tracing": {"level": 3}}}, plugins=plugins,
                          mode="max-autotune-no-cudagraphs").pipeline.runtime
    assert configured["tracing"] == TracingOptions(level=3)  # the pipeline's options are kept
