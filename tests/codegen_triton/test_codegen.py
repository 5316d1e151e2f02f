"""The codegen object (codegen.py): registration, supports() reasons and the eager fallback,
metadata, autotuning switches, and end-to-end runs through torch.compile."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import torch
from torchloom.api import parse_graph
from torchloom.tools import Compiler, EagerCodegen, load_plugins
from torchloom.runtime.executor import CompiledGraph

from conftest import group_text
from torchloom_codegen_triton import TritonCodegen

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_registered_through_the_plugin_hook():
    plugins = load_plugins()
    entry = plugins.codegens["triton"]
    assert isinstance(entry.obj, TritonCodegen)
    assert entry.distribution == "torchloom-codegen-triton"
    assert [c.name for c in plugins.codegen_chain("triton")] == ["triton", "eager"]


REFUSED = {
    "random op": (group_text("%a: f32[4, 8]", """
        %r = aten.rand_like.default(%a) : f32[4, 8]
        %s = aten.add.Tensor(%a, %r) : f32[4, 8]""", "%s: f32[4, 8]"),
        "op aten.rand_like.default is not in its op table"),  # (its capabilities)
    "opaque op": (group_text("%a: f32[4, 8], %b: f32[8, 3]", """
        %m = aten.mm.default(%a, %b) : f32[4, 3]
        %s = aten.relu.default(%m) : f32[4, 3]""", "%s: f32[4, 3]"),
        "op aten.mm.default is not in its op table"),
    "complex dtype": (group_text("%a: c64[4]", """
        %s = aten.add.Tensor(%a, %a) : c64[4]""", "%s: c64[4]"), "dtype c64"),
    # a size no input carries cannot be passed to the kernel (symbolic sizes are)
    "unbound symbol": (group_text("%a: f32[s0, 4]", """
        %s = aten.exp.default(%a) : f32[s1, 4]""", "%s: f32[s1, 4]"),
        "names s1, which is no dim of an input tensor"),
    "mismatched reductions": (group_text("%a: f32[2, 4, 8]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[4, 8]
        %t = aten.sum.dim_IntList(%a) {dim = [2]} : f32[2, 4]""", "%s: f32[4, 8], %t: f32[2, 4]"),
        "reductions over different shapes or dims"),
}


@pytest.mark.parametrize("name", ["sum_last_dim", "sum_dim0_keepdim", "softmax", "rmsnorm"])
def test_a_kernel_reports_its_schedules_form(registry, name):
    """The core's schedule names the kernel's form in its metadata ("form" stays this
    target's variant: persistent, looped, split, ...); its capabilities cover the group."""
    from torchloom.api import Schedule
    from torchloom.testing.reductions import CASES
    from torchloom_codegen_triton.codegen import CAPABILITIES
    from torchloom_codegen_triton.kernel import KernelWriter

    group = next(parse_graph(CASES[name][0]).nodes)
    assert CAPABILITIES.declines(group) is None
    _, metadata = KernelWriter(group, registry).generate()
    assert metadata["schedule"] == Schedule.of(group).form


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_supports_gives_the_reason(registry, codegen, name):
    text, expected = REFUSED[name]
    node = next(parse_graph(text).nodes)
    reason = codegen.supports(node, registry)
    assert reason is not None and reason.codegen == "triton"
    assert expected in reason.message, reason.message


def test_refused_group_runs_on_eager_with_eager_results(registry, codegen):
    text, _ = REFUSED["opaque op"]
    compiled = CompiledGraph(parse_graph(text), registry, [codegen, EagerCodegen()])
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    (got,) = compiled(a, b)
    torch.testing.assert_close(got, torch.relu(a @ b))
    (choice,) = compiled.choices
    assert choice.codegen == "eager"
    assert "aten.mm.default" in str(choice.fallback_reasons[0])


def test_metadata_is_json_and_names_the_kernel(registry, codegen):
    text = group_text("%a: f32[64, 300]", """
        %s = aten.softmax_like_placeholder_never_used_here(%a) : f32[64, 300]""",
                      "%s: f32[64, 300]").replace(
        "aten.softmax_like_placeholder_never_used_here(%a)", "aten.exp.default(%a)")
    kernel = codegen.generate(next(parse_graph(text).nodes), registry)
    meta = json.loads(json.dumps(kernel.metadata))
    assert meta["kind"] == "pointwise" and meta["numel"] == 64 * 300
    assert meta["config"] in meta["configs"]
    assert f"def {meta['kernel']}(" in kernel.source
    assert kernel.source.startswith("# torchloom triton kernel for this group:")
    assert "#     %s = aten.exp.default(%a) : f32[64, 300]" in kernel.source


def test_autotune_switches(monkeypatch, tmp_path, registry):
    monkeypatch.setenv("TORCHLOOM_AUTOTUNE", "0")
    assert TritonCodegen(cache_dir=tmp_path).autotune is False
    assert TritonCodegen(cache_dir=tmp_path, autotune=True).autotune is True
    monkeypatch.setenv("TORCHLOOM_AUTOTUNE", "1")
    cg = TritonCodegen(cache_dir=tmp_path)
    assert cg.autotune is True
    # on the CPU interpreter there is nothing to tune: no tuning record is written
    text = group_text("%a: f32[8, 4]", "%e = aten.exp.default(%a) : f32[8, 4]", "%e: f32[8, 4]")
    compiled = CompiledGraph(parse_graph(text), registry, [cg])
    x = torch.randn(8, 4)
    torch.testing.assert_close(compiled(x)[0], x.exp())
    assert not list(cg.cache_dir.glob("*.tune.json"))
    assert len(list(cg.cache_dir.glob("*.py"))) == 1


@pytest.mark.cuda
def test_autotune_result_is_cached_on_disk(registry, tmp_path):
    from conftest import on_device
    cg = TritonCodegen(cache_dir=tmp_path, autotune=True)
    text = group_text("%a: f32[512, 1024]", "%e = aten.exp.default(%a) : f32[512, 1024]",
                      "%e: f32[512, 1024]")
    x = torch.randn(512, 1024, device="cuda")
    compiled = CompiledGraph(on_device(parse_graph(text), "cuda"), registry, [cg])
    torch.testing.assert_close(compiled(x)[0], x.exp())
    (record,) = cg.cache_dir.glob("*.tune.json")
    best = json.loads(record.read_text())["config"]
    kernel = cg.generate(compiled.choices[0].node, registry)
    assert best in kernel.metadata["configs"]
    assert cg.load(kernel, registry).config == best  # a second load reuses the record


def _workload(name: str, device: str):
    spec = importlib.util.spec_from_file_location(f"workload_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.workload(device=device)


def _run_end_to_end(name: str, device: str):
    torch._dynamo.reset()
    fn, inputs = _workload(name, device)
    compiler = Compiler("default")
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler},
                             dynamic=False)
    ref_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    got, want = compiled(*inputs), fn(*ref_inputs)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    sum(o.sum() for o in got).backward()
    sum(o.sum() for o in want).backward()
    for a, b in zip(inputs, ref_inputs):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    choices = [c for comp in compiler.compilations if comp.compiled
               for c in comp.compiled.choices]
    assert choices and {c.codegen for c in choices} == {"triton"}, [
        str(r) for c in choices for r in c.fallback_reasons]
    torch._dynamo.reset()
    return choices


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "lstm_cell"])
def test_torch_compile_end_to_end_on_the_interpreter(name):
    """Forward and backward through torch.compile(backend="torchloom"), every group on
    the triton codegen (CPU: Triton interpreter), results equal to eager."""
    _run_end_to_end(name, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "lstm_cell", "gelu_bookend",
                                  "transpose_bookend", "bias_gelu", "mlp"])
def test_torch_compile_end_to_end_on_cuda(name):
    _run_end_to_end(name, "cuda")


class _RecordingKernel:
    """Stands in for a compiled triton kernel: records launches (grid, block sizes)."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, num_warps, **blocks):
            self.launches.append((grid, blocks, num_warps))
        return launch


def test_autotune_picks_the_fastest_config_records_it_and_reports_progress(
        tmp_path, monkeypatch, caplog):
    import time

    import triton.testing

    from torchloom_codegen_triton.codegen import Launcher
    configs = [{"XBLOCK": 256, "num_warps": 4}, {"XBLOCK": 1024, "num_warps": 4},
               {"XBLOCK": 512, "num_warps": 8}]
    timings = {256: 3.0, 1024: 1.0, 512: 2.0}

    def fake_bench(fn, warmup, rep):
        fn()
        time.sleep(0.4)  # three configs: over a second, so a progress line is due
        return timings[kernel.launches[-1][1]["XBLOCK"]]

    monkeypatch.setattr(triton.testing, "do_bench", fake_bench)
    kernel = _RecordingKernel()
    meta = {"kernel": "fused_exp", "device": "cpu", "grid_size": 4096, "configs": configs,
            "inputs": [{"shape": [4096], "strides": [1], "dtype": "f32"}],
            "outputs": [{"shape": [4096], "strides": [1], "dtype": "f32"}]}
    tune = tmp_path / "k.tune.json"
    launcher = Launcher(kernel, meta, dict(configs[0]), tune, verbose=True)
    with caplog.at_level(logging.INFO, logger="torchloom.progress"):
        (out,) = launcher(torch.randn(4096))
    assert out.shape == (4096,)
    assert launcher.config == {"XBLOCK": 1024, "num_warps": 4}
    assert kernel.launches[-1] == ((4,), {"XBLOCK": 1024}, 4)  # the real call, best config
    assert json.loads(tune.read_text())["config"] == launcher.config
    logs = [r.getMessage() for r in caplog.records]  # not a terminal: through logging
    assert any(m.startswith("torchloom: triton: autotuning fused_exp 3/3 configs") for m in logs)
    assert any(m.startswith("torchloom: triton: autotuning fused_exp: done in ") for m in logs)
    launcher(torch.randn(4096))  # tuned once: no second round of benchmarks
    assert len(kernel.launches) == 5


def test_cpu_groups_go_to_eager_unless_the_interpreter_is_asked_for(monkeypatch, tmp_path,
                                                                    registry):
    from torchloom.api import parse_graph
    group = next(parse_graph("""graph @g(%x: f32[4]) {
  %y = torchloom.fusion_group(%x) : f32[4] region @group0(%a: f32[4]) {
    %e = aten.exp.default(%a) : f32[4]
    return %e
  }
  return %y
}
""").nodes)
    monkeypatch.delenv("TORCHLOOM_TRITON_CPU", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = TritonCodegen(cache_dir=tmp_path).supports(group, registry)
    assert reason is not None and "TORCHLOOM_TRITON_CPU=1" in reason.message
    assert TritonCodegen(cache_dir=tmp_path, cpu_interpreter=True).supports(group, registry) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert TritonCodegen(cache_dir=tmp_path).supports(group, registry) is None


def test_a_group_declined_for_its_device_costs_no_kernel(monkeypatch, tmp_path, registry):
    import torchloom_codegen_triton.codegen as module
    written = []

    def writer(group, *args, **kwargs):
        written.append(group.region.name)
        raise AssertionError("a kernel was written")
    monkeypatch.setattr(module, "KernelWriter", writer)
    group = next(parse_graph(group_text("%a: f32[4]", """
        %e = aten.exp.default(%a) : f32[4]""", "%e: f32[4]")).nodes)
    reason = TritonCodegen(cache_dir=tmp_path, cpu_interpreter=False).supports(group, registry)
    assert reason is not None and "CPU group" in reason.message and written == []
    cuda = next(parse_graph(group_text("%a: f32[4] @cuda:0", """
        %e = aten.exp.default(%a) : f32[4] @cuda:0""", "%e: f32[4] @cuda:0")).nodes)
    target = TritonCodegen(cache_dir=tmp_path).for_target("sm_90")
    assert target.supports(group, registry).message.startswith("group on cpu, not on the target")
    assert written == []
    if not torch.cuda.is_available():
        reason = TritonCodegen(cache_dir=tmp_path).supports(cuda, registry)
        assert "CUDA is not available" in reason.message and written == []


def test_supports_then_generate_write_the_kernel_once(monkeypatch, tmp_path, registry):
    import torchloom_codegen_triton.codegen as module
    writes = []
    real = module.KernelWriter

    def counted(group, *args, **kwargs):
        writes.append(group.region.name)
        return real(group, *args, **kwargs)
    monkeypatch.setattr(module, "KernelWriter", counted)
    codegen = TritonCodegen(cache_dir=tmp_path)
    text = group_text("%a: f32[4]", """
        %e = aten.exp.default(%a) : f32[4]""", "%e: f32[4]")
    group = next(parse_graph(text).nodes)
    assert codegen.supports(group, registry) is None
    kernel = codegen.generate(group, registry)
    assert len(writes) == 1
    # generated again (a prepare, a dump): the kernel kept, not written again
    assert codegen.generate(group, registry).source == kernel.source and len(writes) == 1
    # an equal group that is another object is written afresh: the same kernel
    other = next(parse_graph(text).nodes)
    assert codegen.generate(other, registry).source == kernel.source and len(writes) == 2
