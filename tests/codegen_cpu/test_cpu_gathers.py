"""Gathers in cpu kernels: an embedding's rows read at their indices inside the kernel
that reads them (``GATHER_OPS``; fusion takes them where the cpu codegen compiles the
groups), every index checked before the kernel writes anything (gathers.py), eager's
``IndexError`` raised for one outside the table."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph
from torchloom.backend import torchloom_backend
from torchloom.runtime.executor import CompiledGraph
from torchloom.tools import Compiler, EagerCodegen

from conftest import codegens, compare, compiled, group_text

from torchloom_codegen_cpu import launcher as launcher_module

DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16,
          "f16": torch.float16}
INDEX_DTYPES = {"i64": torch.int64, "i32": torch.int32}


def _dims(shape) -> str:
    return ", ".join(map(str, shape))


def _embedding_group(table: str, rows: int, width: int, ids: str, shape, tail: str,
                     result: str) -> str:
    """A group: ``%e = embedding(%w, %i)`` then the statements ``tail`` (reading ``%e``)."""
    out = f"{table}[{_dims([*shape, width])}]"
    return group_text(f"%w: {table}[{rows}, {width}], %i: {ids}[{_dims(shape)}]", f"""
        %e = aten.embedding.default(%w, %i) : {out}
        {tail}""", result)


@pytest.mark.parametrize("table", list(DTYPES))
@pytest.mark.parametrize("ids", list(INDEX_DTYPES))
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4)], ids=str)
def test_gather_then_pointwise_matches_eager(check, table, ids, shape):
    width, rows = 24, 11
    text = _embedding_group(table, rows, width, ids, shape,
                            f"%y = aten.mul.Tensor(%e) {{other = 2.0}} : "
                            f"{table}[{_dims([*shape, width])}]",
                            f"%y: {table}[{_dims([*shape, width])}]")
    g = torch.Generator().manual_seed(len(shape))
    w = torch.randn(rows, width, generator=g).to(DTYPES[table])
    i = torch.randint(0, rows, shape, generator=g, dtype=INDEX_DTYPES[ids])
    got, _ = check(text, w, i, exact=True)
    assert torch.equal(got[0], F.embedding(i.long(), w) * 2)


@pytest.mark.parametrize("width", [1, 5, 16, 67, 256])
def test_gather_sum_then_layer_norm_matches_eager(check, width):
    """BERT's embeddings: three lookups summed, then a layer norm over the row."""
    shape, f = (2, 9), f"f32[2, 9, {width}]"
    text = group_text(f"%a: f32[30, {width}], %b: f32[9, {width}], %c: f32[2, {width}], "
                      f"%i: i64[2, 9], %p: i64[2, 9], %t: i64[2, 9]", f"""
        %x = aten.embedding.default(%a, %i) {{padding_idx = 0}} : {f}
        %y = aten.embedding.default(%b, %p) : {f}
        %z = aten.embedding.default(%c, %t) : {f}
        %s = aten.add.Tensor(%x, %y) : {f}
        %u = aten.add.Tensor(%s, %z) : {f}
        %v, %m = aten.var_mean.correction(%u) {{correction = 0, dim = [2], keepdim = true}} : f32[2, 9, 1], f32[2, 9, 1]
        %ve = aten.add.Tensor(%v) {{other = 1e-05}} : f32[2, 9, 1]
        %r = aten.rsqrt.default(%ve) : f32[2, 9, 1]
        %d = aten.sub.Tensor(%u, %m) : {f}
        %n = aten.mul.Tensor(%d, %r) : {f}""",
                      f"%u: {f}, %n: {f}, %m: f32[2, 9, 1]")
    g = torch.Generator().manual_seed(width)
    tables = [torch.randn(n, width, generator=g) for n in (30, 9, 2)]
    ids = torch.randint(0, 30, shape, generator=g)
    positions = torch.arange(9).expand(2, 9)  # stride 0 along the batch, as BERT's
    types = torch.zeros(shape, dtype=torch.long)
    check(text, *tables, ids, positions, types, rtol=1e-5, atol=1e-5)


def test_gather_read_across_its_rows_matches_eager(check):
    """T5's relative position bias: buckets gathered into [q, k, heads], read permuted to
    [heads, q, k] and added to a mask; and a sum over the sequence (a column reduction):
    the index varies along the row loop."""
    text = group_text("%w: f32[32, 4], %b: i64[6, 10], %m: f32[1, 1, 6, 10]", """
        %e = aten.embedding.default(%w, %b) : f32[6, 10, 4]
        %p = aten.permute.default(%e) {dims = [2, 0, 1]} : f32[4, 6, 10]
        %u = aten.unsqueeze.default(%p) {dim = 0} : f32[1, 4, 6, 10]
        %y = aten.add.Tensor(%u, %m) : f32[1, 4, 6, 10]
        %s = aten.sum.dim_IntList(%e) {dim = [0]} : f32[10, 4]""",
                      "%y: f32[1, 4, 6, 10], %s: f32[10, 4]")
    g = torch.Generator().manual_seed(0)
    w, mask = torch.randn(32, 4, generator=g), torch.randn(1, 1, 6, 10, generator=g)
    buckets = torch.randint(0, 32, (6, 10), generator=g)
    check(text, w, buckets, mask, rtol=1e-6, atol=1e-6)
    check(text, w, buckets.t().contiguous().t(), mask, rtol=1e-6, atol=1e-6)  # strided


def test_gather_of_a_strided_table_matches_eager(check):
    text = group_text("%w: f32[12, 8] strided[1, 12], %i: i64[5]", """
        %e = aten.embedding.default(%w, %i) : f32[5, 8]
        %y = aten.neg.default(%e) : f32[5, 8]""", "%y: f32[5, 8]")
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 12, generator=g).t()
    check(text, w, torch.randint(0, 12, (5,), generator=g), exact=True)


@pytest.mark.parametrize("bad", [12, 13, 10**12, -1, -(2**63)])
@pytest.mark.parametrize("entry", [True, False], ids=["entry", "ctypes"])
def test_an_index_outside_the_table_raises_as_eager(registry, codegen, monkeypatch, bad,
                                                   entry):
    if not entry:  # the launcher's ctypes path: the function's result read by ctypes
        monkeypatch.setattr(launcher_module, "python_entry", lambda lib, name: None)
    text = _embedding_group("f32", 12, 8, "i64", (3, 4), "%y = aten.neg.default(%e) : f32[3, 4, 8]",
                            "%y: f32[3, 4, 8]")
    compiled_graph = CompiledGraph(parse_graph(text), registry, [codegen])
    w = torch.randn(12, 8)
    ids = torch.randint(0, 12, (3, 4))
    compare(compiled_graph(w, ids), [F.embedding(ids, w).neg()], exact=True)
    ids[2, 1] = bad
    with pytest.raises(IndexError, match="index out of range in self"):
        F.embedding(ids, w)
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled_graph(w, ids)


@pytest.mark.parametrize("shape", ["3, 0, 9", "3, s0, 9"])
def test_an_index_is_checked_where_every_output_is_empty(registry, codegen, shape):
    """Eager checks the indices of a lookup multiplied into an empty tensor too: the kernel
    checks every index its region's gathers read and runs with empty outputs."""
    text = group_text(f"%w: f32[12, 9], %i: i64[3, 1], %x: f32[{shape}]", f"""
        %e = aten.embedding.default(%w, %i) : f32[3, 1, 9]
        %y = aten.mul.Tensor(%e, %x) : f32[{shape}]""", f"%y: f32[{shape}]")
    compiled_graph = CompiledGraph(parse_graph(text), registry, [codegen])
    w, x = torch.randn(12, 9), torch.randn(3, 0, 9)
    for ids in (torch.tensor([[3], [11], [0]]), torch.zeros(3, 1, dtype=torch.long)):
        compare(compiled_graph(w, ids, x), [F.embedding(ids, w) * x], exact=True)
    if "s0" in shape:  # (and with elements, at another size)
        ids, x = torch.tensor([[3], [11], [0]]), torch.randn(3, 4, 9)
        compare(compiled_graph(w, ids, x), [F.embedding(ids, w) * x], exact=True)
    for bad in (12, -1):
        ids = torch.tensor([[3], [bad], [0]])
        for args in ((w, ids, torch.randn(3, 0, 9)), (w, ids, torch.randn(3, 2, 9))):
            if args[2].shape[1] and "s0" not in shape:
                continue
            with pytest.raises(IndexError, match="index out of range in self"):
                F.embedding(ids, w) * args[2]
            with pytest.raises(IndexError, match="index out of range in self"):
                compiled_graph(*args)
    assert [c.codegen for c in compiled_graph.choices] == ["cpu"]


def test_an_empty_output_raises_as_eager_end_to_end(tmp_path):
    torch._dynamo.reset()

    def f(w, i, x):
        return F.embedding(i, w) * x

    compiler, fn = compiled(f, tmp_path)
    w, x = torch.randn(12, 9), torch.randn(3, 0, 9)
    assert fn(w, torch.tensor([[3], [11], [1]]), x).shape == (3, 0, 9)
    with pytest.raises(IndexError, match="index out of range in self"):
        fn(w, torch.tensor([[3], [12], [1]]), x)
    assert set(codegens(compiler)) == {"cpu"}


@pytest.mark.parametrize("table", [(5, 0), (0, 3)], ids=str)
@pytest.mark.parametrize("ids", [[1], [7], []], ids=str)
def test_an_empty_table_behaves_as_eager(tmp_path, table, ids):
    """A table without rows or columns stays an eager lookup (fusion leaves it out of
    groups): its results and its errors, type and text, are eager's."""
    torch._dynamo.reset()

    def f(w, i):
        return F.embedding(i, w) + 1

    w, i = torch.randn(*table), torch.tensor(ids, dtype=torch.long)
    _, fn = compiled(f, tmp_path)
    try:
        expected = f(w, i)
    except Exception as error:  # noqa: BLE001 (the same error, whatever eager raises)
        with pytest.raises(type(error), match=re.escape(str(error).split(",")[0])):
            fn(w, i)
    else:
        compare([fn(w, i)], [expected], exact=True)


def test_indices_computed_in_the_group_are_declined(registry, codegen):
    """The kernel checks indices in memory, before it runs: indices the group computes are
    left to eager with the reason (fusion never makes such a group)."""
    text = group_text("%w: f32[12, 8], %i: i64[5]", """
        %j = aten.add.Tensor(%i) {other = 1} : i64[5]
        %e = aten.embedding.default(%w, %j) : f32[5, 8]""", "%e: f32[5, 8]")
    compiled_graph = CompiledGraph(parse_graph(text), registry, [codegen, EagerCodegen()])
    assert [c.codegen for c in compiled_graph.choices] == ["eager"]
    reasons = " ".join(str(r) for c in compiled_graph.choices for r in c.fallback_reasons)
    assert "computed in the group" in reasons
    w, i = torch.randn(12, 8), torch.arange(5)
    compare(compiled_graph(w, i), [F.embedding(i + 1, w)], exact=True)


class _Embeddings(torch.nn.Module):
    def __init__(self, vocab: int = 50, width: int = 32):
        super().__init__()
        self.words = torch.nn.Embedding(vocab, width, padding_idx=0)
        self.positions = torch.nn.Embedding(64, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, ids):
        positions = torch.arange(ids.shape[-1]).expand_as(ids)
        return self.norm(self.words(ids) + self.positions(positions))


def test_embeddings_compile_to_one_kernel_and_raise_as_eager(tmp_path):
    torch.manual_seed(0)
    model = _Embeddings().eval()
    compiler, fn = compiled(model, tmp_path)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for length in (7, 12, 20):  # the second length makes the graph symbolic
            ids = torch.randint(0, 50, (3, length), generator=g)
            torch.testing.assert_close(fn(ids), model(ids), rtol=1e-5, atol=1e-5)
        ids[1, 4] = 50
        with pytest.raises(IndexError):
            fn(ids)
    assert set(codegens(compiler)) == {"cpu"}
    for comp in compiler.compilations:  # the lookups are inside the kernel
        ops = [n.op for n in comp.graph.nodes]
        assert "aten.embedding.default" not in ops, ops


def test_training_with_gathers_matches_eager(tmp_path):
    torch.manual_seed(0)
    model = _Embeddings()
    reference = _Embeddings()
    reference.load_state_dict(model.state_dict())
    compiler, fn = compiled(model, tmp_path)
    ids = torch.randint(0, 50, (4, 10), generator=torch.Generator().manual_seed(3))
    fn(ids).square().sum().backward()
    reference(ids).square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert "eager" not in codegens(compiler)


def test_gathers_stay_outside_groups_for_other_codegens(tmp_path):
    """Only the cpu codegen reads tables at indices: a pipeline compiling CPU groups with
    another codegen keeps the embeddings plain ops."""
    pipeline = tmp_path / "eager.toml"
    pipeline.write_text('[pipeline]\nname = "eager-groups"\nextends = "default"\n'
                        'codegen = ["eager"]\n')
    compiler = Compiler(str(pipeline), cache_dir=tmp_path, compile_cache=False)
    torch._dynamo.reset()
    model = _Embeddings().eval()
    fn = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(fn(ids), model(ids), rtol=1e-5, atol=1e-5)
    ops = [n.op for comp in compiler.compilations for n in comp.graph.nodes]
    assert ops.count("aten.embedding.default") == 2, ops


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 40), width=st.integers(1, 40),
       shape=st.lists(st.integers(1, 6), min_size=0, max_size=3),
       table=st.sampled_from(["f32", "bf16", "f64"]), ids=st.sampled_from(["i64", "i32"]),
       seed=st.integers(0, 2**16))
def test_gathers_of_any_shape_match_eager(check, rows, width, shape, table, ids, seed):
    out = f"{table}[{_dims([*shape, width])}]"
    text = _embedding_group(table, rows, width, ids, shape,
                            f"%y = aten.add.Tensor(%e, %e) : {out}", f"%y: {out}, %e: {out}")
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, width, generator=g).to(DTYPES[table])
    i = torch.randint(0, rows, shape, generator=g, dtype=INDEX_DTYPES[ids])
    check(text, w, i, exact=True)


def test_the_kernel_reads_the_rows_it_gathers(check):
    """explain's bytes: a table of 1,000 rows read at 12 indices moves 12 rows."""
    text = _embedding_group("f32", 1000, 8, "i64", (3, 4),
                            "%y = aten.neg.default(%e) : f32[3, 4, 8]", "%y: f32[3, 4, 8]")
    meta = check.codegen.generate(check.compile(text).choices[0].node, check.registry).metadata
    assert meta["checks"] == "index"
    assert meta["bytes_read"] == 12 * 8 * 4 + 12 * 8
    assert meta["bytes_written"] == 12 * 8 * 4


def test_a_table_is_never_written_over_by_the_kernel(check):
    """A table of the output's type (64 rows gathered at 64 indices) is no in-place input:
    a row the kernel wrote over could be gathered after (the plan reuses an input that dies
    at the group for an output the kernel may write over it)."""
    text = _embedding_group("f32", 64, 16, "i64", (64,),
                            "%y = aten.mul.Tensor(%e) {other = 2.0} : f32[64, 16]",
                            "%y: f32[64, 16]")
    meta = check.codegen.generate(check.compile(text).choices[0].node, check.registry).metadata
    assert meta["inplace"] == []
    w = torch.randn(64, 16)
    ids = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    check(text, w, ids, exact=True)


@pytest.mark.parametrize("rows", [12, 3000])
def test_a_row_reduction_over_a_transposed_table_matches_eager(check, rows):
    """The table's rows lie across memory (a transposed weight): the reduction reads
    each gathered row with a stride (the row form may stage tensors lying across rows)."""
    width = 300
    text = group_text(f"%w: f32[{rows}, {width}] strided[1, {rows}], %i: i64[40]", f"""
        %e = aten.embedding.default(%w, %i) : f32[40, {width}]
        %s = aten.sum.dim_IntList(%e) {{dim = [1], keepdim = true}} : f32[40, 1]
        %y = aten.div.Tensor(%e, %s) : f32[40, {width}]""", f"%y: f32[40, {width}], %s: f32[40, 1]")
    g = torch.Generator().manual_seed(rows)
    w = torch.rand(width, rows, generator=g).t() + 0.5
    check(text, w, torch.randint(0, rows, (40,), generator=g), rtol=1e-5, atol=1e-6)
