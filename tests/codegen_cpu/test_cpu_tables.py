"""Result tables (tables.py): an expensive unary op of a bf16 value read from a table of its
65,536 results. Checked on every one of the 65,536 inputs: against eager (f16 too, which
computes), and bit for bit against the same source built without tables (so a table
changes no value); and structurally: which ops get a table, one definition per
translation unit."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import parse_graph

from conftest import compare, group_text
from torchloom_codegen_cpu import CpuCodegen, tables, toolchain
from torchloom_codegen_cpu.ops import POINTWISE

N = 65536
#: tabulated ops and attributes as IR text
OPS = [(op, "") for op in sorted(tables.TABULATED)] + [("aten.gelu.default",
                                                        '{approximate = "tanh"}')]


def every_value(dtype: str) -> torch.Tensor:
    """The 65,536 values of a 16-bit float type, in bit order (NaNs, infs, -0.0 and
    subnormals included)."""
    bits = torch.arange(N, dtype=torch.int32).to(torch.int16)  # wraps: every pattern
    return bits.view(torch.bfloat16 if dtype == "bf16" else torch.float16)


def _group(dtype: str) -> str:
    lines = [f"%o{k} = {op}(%a) {attrs} : {dtype}[{N}]".replace("  ", " ")
             for k, (op, attrs) in enumerate(OPS)]
    return group_text(f"%a: {dtype}[{N}]", "\n".join(lines),
                      ", ".join(f"%o{k}: {dtype}[{N}]" for k in range(len(OPS))))


def test_the_tabulated_ops_are_unary_float_ops_of_the_table():
    assert tables.TABULATED <= set(POINTWISE)
    assert all(POINTWISE[op].template is not None for op in tables.TABULATED)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_every_input_of_every_tabulated_op_matches_eager(check, dtype):
    x = every_value(dtype)
    got, _ = check(_group(dtype), x)
    assert len(got) == len(OPS)


def _outputs(codegen: CpuCodegen, registry, dtype: str) -> list[torch.Tensor]:
    from torchloom.runtime.executor import CompiledGraph
    compiled = CompiledGraph(parse_graph(_group(dtype)), registry, [codegen])
    assert [c.codegen for c in compiled.choices] == ["cpu"]
    return compiled(every_value(dtype))


@pytest.mark.parametrize("dtype", ["bf16"])
def test_tables_change_no_value(registry, tmp_path, monkeypatch, dtype):
    """The same group built with tables and without: every output bit for bit the same
    (NaNs included) on all 65,536 inputs."""
    with_tables = CpuCodegen(cache_dir=tmp_path / "tables")
    flags = with_tables.toolchain().flags
    if "-DTL_TABLES=1" not in flags:
        pytest.skip(f"no vector gathers here (toolchain flags {flags}): no tables to compare")
    monkeypatch.setattr(toolchain, "_table_flags", lambda *args: ())
    without = CpuCodegen(cache_dir=tmp_path / "computed")
    assert "-DTL_TABLES=1" not in without.toolchain().flags
    got, want = _outputs(with_tables, registry, dtype), _outputs(without, registry, dtype)
    for (op, attrs), g, w in zip(OPS, got, want):
        assert torch.equal(g.view(torch.int16), w.view(torch.int16)), (op, attrs, flags)


def test_toolchain_uses_tables_where_gathers_vectorize(tmp_path):
    """On a CPU with AVX-512 whose compiler is gcc (this project's CI machines), the probe
    turns tables and 512-bit vectors on; on other CPUs it turns tables on only if the
    compiler gathers, and never asks for 512-bit vectors."""
    tc = CpuCodegen(cache_dir=tmp_path).toolchain()
    have_tables = "-DTL_TABLES=1" in tc.flags
    avx512 = "avx512f" in toolchain.cpu_features()
    assert ("-mprefer-vector-width=512" in tc.flags) == avx512
    if not avx512:
        assert not have_tables
    elif "clang" not in tc.version:  # gcc, with the gather tuning flag if it needed one
        assert have_tables
        added = [f for f in tc.flags if f not in toolchain.FLAGS]
        assert set(added) <= {"-DTL_LIBMVEC", "-DTL_PYENTRY", "-mtune-ctrl=use_gather",
                              "-DTL_TABLES=1", "-mprefer-vector-width=512",
                              *toolchain.NO_PRE}, added


def _source(codegen: CpuCodegen, registry, text: str) -> str:
    return codegen.generate(next(parse_graph(text).nodes), registry).source


@pytest.mark.parametrize("op, attrs", OPS)
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_tabulated_op_of_bf16_reads_its_table(codegen, registry, op, attrs, dtype):
    text = group_text(f"%a: {dtype}[8, 40]",
                      f"%o = {op}(%a) {attrs} : {dtype}[8, 40]".replace("  ", " "),
                      f"%o: {dtype}[8, 40]")
    source = _source(codegen, registry, text)
    if dtype == "f16":  # no f16 tables (gcc does not vectorize their reads)
        assert "TL_TABLE_" not in source
        return
    assert source.count("#ifndef TL_TABLE_") == 1
    body = source[source.index("torchloom cpu kernel for this group"):]
    assert "_table[" not in body and "tl_t" in body  # the kernel calls the table's macro
    # stored as the table's bits, not rounded again
    assert "tl_bits_bf16(" in body and "tl_f32_to_bf16(" not in body


@pytest.mark.parametrize("line, params", [
    # f32 in, f32 out: 2^32 inputs, no table
    ("%o = aten.gelu.default(%a) : f32[8, 40]", "%a: f32[8, 40]"),
    # a bf16 result of an f32 input is rounded once from f32: no table
    ("%o = aten.add.Tensor(%a, %b) : bf16[8, 40]", "%a: bf16[8, 40], %b: bf16[8, 40]"),
    # a cheap op: computed
    ("%o = aten.relu.default(%a) : bf16[8, 40]", "%a: bf16[8, 40]"),
])
def test_ops_without_a_table(codegen, registry, line, params):
    out = line.rsplit(": ", 1)[1]
    source = _source(codegen, registry, group_text(params, line, f"%o: {out}"))
    assert "TL_TABLE_" not in source


def test_a_shifted_exp_is_computed_not_read(codegen, registry):
    """softmax's exp(a - max(a)) stays tl_exp_nonpos (about a table read's cost)."""
    t = "bf16[8, 40]"
    text = group_text(
        f"%a: {t}",
        "%m = aten.amax.default(%a) {dim = [-1], keepdim = true} : bf16[8, 1]\n"
        f"%s = aten.sub.Tensor(%a, %m) : {t}\n%e = aten.exp.default(%s) : {t}", f"%e: {t}")
    source = _source(codegen, registry, text)
    assert "tl_exp_nonpos(" in source and "TL_TABLE_" not in source


def test_kernels_sharing_a_table_define_it_once(codegen, registry):
    """Two groups reading the same table in one translation unit: it compiles (the guard
    macro keeps one definition) and both run as eager does."""
    kernels = []
    for shape in ("[8, 40]", "[3, 5, 7]"):
        text = group_text(f"%a: bf16{shape}", f"%o = aten.gelu.default(%a) : bf16{shape}",
                          f"%o: bf16{shape}")
        kernels.append(codegen.generate(next(parse_graph(text).nodes), registry))
    unit = CpuCodegen.translation_unit(kernels)
    key = kernels[0].source.split("#ifndef TL_TABLE_", 1)[1].split("\n", 1)[0]
    assert unit.count(f"#ifndef TL_TABLE_{key}") == 2
    assert unit.count(f"static float tl_t{key}_table[65536];") == 2  # one is preprocessed away
    loaded = codegen.load_many(kernels, registry)
    for kernel, shape in zip(loaded, ((8, 40), (3, 5, 7))):
        x = torch.randn(shape).to(torch.bfloat16)
        compare(kernel(x), [torch.nn.functional.gelu(x)])


def test_512_bit_vectors_only_where_the_cpu_has_avx512(tmp_path):
    """``_width_flags`` asks for 512-bit vectors on an AVX-512 CPU (when the compiler takes
    the flag), and on no other."""
    cc = toolchain.find_compiler()
    assert toolchain._width_flags(cc, tmp_path, 60, "x86_64:avx,avx2,fma") == ()
    assert toolchain._width_flags(cc, tmp_path, 60, "aarch64:asimd") == ()
    assert toolchain._width_flags(cc, tmp_path, 60, "x86_64:avx2,avx512f,avx512bw") == \
        ("-mprefer-vector-width=512",)
