"""Matrix products in blocks of columns (torchloom.codegen.gemm): the blocked ``mm`` gives
the whole call's bits (every shape, layout, dtype, block width, with and without ``out=``),
the plan calls it only for the ``mm`` nodes ``GemmBlocks`` chose (measured once per
shape), through the plan's buffer reuse too, and where autograd records the product it
calls ``mm`` whole. The measurement (speed) is not asserted here: it is a benchmark's
(RESULTS.md); its contract (a width only where the blocks gave the whole call's bits) is."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.codegen.gemm import (MAX_ELEMENTS, MAX_MACS, MIN_MACS, SIZES, GemmBlocks,
                                    blocked_addmm, blocked_mm, measure)
from torchloom.codegen.plan import build_function
from torchloom.ir import parse_graph
from torchloom.ir.types import TensorType
from torchloom.ops.aten import default_registry


def test_blocks_are_equal_and_leave_no_narrow_remainder():
    seen = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.mm:
                seen.append(args[1].shape[1])
            return func(*args, **(kwargs or {}))
    a, b = operands(64, 32, 50257, torch.float32, True)
    with Recording():
        blocked_mm(("cols", 1024))(a, b)
    assert sum(seen) == 50257 and len(seen) == 50 and all(w % 16 == 0 for w in seen[:-1])
    assert max(seen) - min(seen) < 160


@pytest.fixture(scope="module")
def registry():
    return default_registry()


def operands(m, k, n, dtype, transposed, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, k, generator=g).to(dtype).t() if transposed else \
        torch.randn(k, n, generator=g).to(dtype)
    return a, b


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 300), n=st.integers(1, 2100),
       size=st.sampled_from([1, 7, 64, 512, 1024, 4096]), axis=st.sampled_from(["cols", "rows"]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       transposed=st.booleans(), into=st.booleans())
def test_blocked_mm_gives_the_whole_calls_values(m, k, n, size, axis, dtype, transposed,
                                                 into):
    """Values (the bits are not a library guarantee: a block of a few columns is
    multiplied by another kernel than the whole; ``measure`` compares the bits of each
    shape it chooses blocks for, see the last test)."""
    a, b = operands(m, k, n, dtype, transposed)
    want = torch.mm(a, b)
    out = torch.full((m, n), float("nan"), dtype=dtype) if into else None
    got = blocked_mm((axis, size))(a, b, out=out)
    tolerance = {torch.bfloat16: 2e-2}.get(dtype, 1e-5)
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * k ** 0.5)
    assert got.is_contiguous()
    if into:
        assert got is out


def test_blocked_mm_leaves_products_autograd_records_whole():
    a, b = operands(8, 16, 1100, torch.float32, True)
    a.requires_grad_()
    got = blocked_mm(("cols", 512))(a, b)
    assert got.grad_fn is not None  # (out= would have refused)
    got.sum().backward()
    torch.testing.assert_close(a.grad, b.sum(1).expand(8, 16))


def mm_graph(m, k, n, b_strides="", dtype="f32", dims=None) -> str:
    a_dims, b_dims = dims or (f"{m}, {k}", f"{k}, {n}")
    return f"""\
graph @g(%a: {dtype}[{a_dims}], %b: {dtype}[{b_dims}]{b_strides}) {{
  %y = aten.mm.default(%a, %b) : {dtype}[{m}, {n}]
  return %y
}}"""


def node_of(text: str):
    g = parse_graph(text)
    return next(n for n in g.nodes if n.op == "aten.mm.default")


def test_only_large_static_dense_products_are_measured():
    asked = []
    blocks = GemmBlocks(measure=lambda a, b, bias: asked.append((a, b)) or ("cols", 512))
    m, k = 64, 256
    n = -(-MIN_MACS // (m * k))  # the smallest product measured
    assert blocks.callable_for(node_of(mm_graph(m, k, n))) is not None
    assert blocks.callable_for(node_of(mm_graph(m, k, n - 1))) is None  # below MIN_MACS
    big = MAX_MACS // (512 * 256) + 1
    assert blocks.callable_for(node_of(mm_graph(512, 256, big))) is None  # too long to time
    assert blocks.callable_for(node_of(mm_graph(8192, 8, 8192))) is None  # too much memory
    assert blocks.callable_for(node_of(mm_graph(2048, 2048, 2048))) is None  # sides < MIN_SIDE
    assert MAX_ELEMENTS < 2 * 8192 * 8192
    assert blocks.callable_for(node_of(mm_graph(512, 256, 4096, dims=("s0, 256", "256, 4096")
                                                ).replace("s0", "512"))) is not None
    symbolic = mm_graph(512, 256, 4096).replace("f32[512, 256]", "f32[s0, 256]", 1) \
        .replace(": f32[512, 4096]", ": f32[s0, 4096]")
    assert blocks.callable_for(node_of(symbolic)) is None
    gappy = mm_graph(512, 256, 4096, " strided[8192, 1]")  # rows with gaps: not dense
    assert blocks.callable_for(node_of(gappy)) is None
    assert blocks.callable_for(node_of(mm_graph(512, 256, 4096, dtype="i64"))) is None
    assert len(asked) == 2  # two shapes measured; the equal ones after them asked nothing
    spent = GemmBlocks(measure=lambda a, b, bias: asked.append(1) or ("cols", 512), budget_s=0)
    assert spent.callable_for(node_of(mm_graph(512, 256, 4096))) is None  # no time left
    assert len(asked) == 2
    assert GemmBlocks(enabled=False, measure=lambda a, b, bias: ("cols", 512)).callable_for(
        node_of(mm_graph(512, 256, 4096))) is None


def test_measured_once_per_shape_layout_and_threads():
    asked = []
    blocks = GemmBlocks(measure=lambda a, b, bias: asked.append(b.actual_strides()) or None)
    plain, transposed = mm_graph(512, 256, 4096), mm_graph(512, 256, 4096, " strided[1, 256]")
    for text in (plain, plain, transposed, transposed):
        assert blocks.callable_for(node_of(text)) is None
    assert asked == [(4096, 1), (1, 256)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        blocks.callable_for(node_of(plain))
    finally:
        torch.set_num_threads(threads)
    assert len(asked) == 3


class MatrixProducts(TorchDispatchMode):
    """Counts the calls of ``packet`` (``aten.mm`` by default; every overload) under it."""

    def __init__(self, packet=torch.ops.aten.mm):
        super().__init__()
        self.calls, self.packet = 0, packet

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket is self.packet
        return func(*args, **(kwargs or {}))


def test_the_plan_calls_the_chosen_blocks_and_reuses_buffers(registry):
    # two products: the second's output goes into the first's dead buffer (out=)
    text = """\
graph @g(%a: f32[512, 256], %b: f32[256, 4096] strided[1, 256], %c: f32[4096, 256]) {
  %y = aten.mm.default(%a, %b) : f32[512, 4096]
  %z = aten.mm.default(%y, %c) : f32[512, 256]
  %e = aten.neg.default(%z) : f32[512, 256]
  %w = aten.mm.default(%e, %b) : f32[512, 4096]
  return %w
}"""
    calls = []

    def chosen(a, b, bias):
        calls.append(b.shape)
        return "cols", 512
    blocks = GemmBlocks(measure=chosen)
    plan = build_function(parse_graph(text), registry, calls=blocks.callable_for)
    assert calls == [(256, 4096)]  # y and w: one shape; z: 512 x 256, too narrow
    a, b, c = torch.randn(512, 256), torch.randn(4096, 256).t(), torch.randn(4096, 256)
    want = torch.mm(torch.mm(a, b), c).neg().mm(b)
    with MatrixProducts() as counted:
        (got,) = plan.fn(a, b, c)
    assert torch.equal(got, want)
    assert counted.calls == 8 + 1 + 8  # y and w in blocks of 512 columns, z whole
    assert plan.reuse.ops  # (w is written into y's dead buffer: the blocks take out=)
    plain = build_function(parse_graph(text), registry,
                           calls=GemmBlocks(enabled=False).callable_for)
    with MatrixProducts() as counted:
        assert torch.equal(plain.fn(a, b, c)[0], want)
    assert counted.calls == 3


@pytest.mark.parametrize("m, n, bias", [(256, 4096, None), (4096, 256, None),
                                        (256, 4096, (4096,))])
def test_measure_chooses_blocks_only_with_the_whole_calls_bits(m, n, bias):
    a = TensorType.make((m, 256), "f32")
    b = TensorType.make((256, n), "f32", strides=(1, 256))
    blocks = measure(a, b, bias)
    assert blocks is None or blocks in [(axis, size) for axis in ("cols", "rows")
                                        for size in SIZES]
    if blocks is not None:
        x, y = operands(m, 256, n, torch.float32, True, seed=3)
        if bias is None:
            assert torch.equal(blocked_mm(blocks)(x, y), torch.mm(x, y))
        else:
            c = torch.randn(bias)
            assert torch.equal(blocked_addmm(blocks)(c, x, y), torch.addmm(c, x, y))


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 200), k=st.integers(1, 100), n=st.integers(1, 1500),
       size=st.sampled_from([1, 64, 512]), axis=st.sampled_from(["cols", "rows"]),
       bias=st.sampled_from(["n", "1n", "mn", "m1", "1", "scalar"]),
       beta=st.sampled_from([1, 0.5]), into=st.booleans())
def test_blocked_addmm_gives_the_whole_calls_values(m, k, n, size, axis, bias, beta, into):
    a, b = operands(m, k, n, torch.float32, True)
    c = torch.randn({"n": (n,), "1n": (1, n), "mn": (m, n), "m1": (m, 1), "1": (1,),
                     "scalar": ()}[bias])
    want = torch.addmm(c, a, b, beta=beta)
    out = torch.empty(m, n) if into else None
    got = blocked_addmm((axis, size))(c, a, b, beta=beta, out=out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * k ** 0.5)
    assert got is out or not into


def test_the_plan_calls_addmm_in_blocks_where_chosen(registry):
    text = """\
graph @g(%c: f32[4096], %a: f32[512, 256], %b: f32[256, 4096] strided[1, 256]) {
  %y = aten.addmm.default(%c, %a, %b) : f32[512, 4096]
  %z = aten.addmm.default(%c, %a, %b) {beta = 2.0} : f32[512, 4096]
  return %y, %z
}"""
    asked = []
    blocks = GemmBlocks(measure=lambda a, b, bias: asked.append(bias) or ("cols", 512))
    plan = build_function(parse_graph(text), registry, calls=blocks.callable_for)
    assert asked == [(4096,)]  # z (beta 2) is called whole, unmeasured
    c, a, b = torch.randn(4096), torch.randn(512, 256), torch.randn(4096, 256).t()
    with MatrixProducts(torch.ops.aten.addmm) as counted:
        y, z = plan.fn(c, a, b)
    assert counted.calls == 8 + 1
    assert torch.equal(y, torch.addmm(c, a, b)) and torch.equal(z, torch.addmm(c, a, b, beta=2))


def test_measurements_are_kept_for_the_next_process_on_this_machine(tmp_path):
    path = tmp_path / "cache" / "gemm-blocks.json"
    asked = []

    def counting(choice):
        return lambda a, b, bias: asked.append(b.shape) or choice
    node = node_of(mm_graph(512, 256, 4096))
    first = GemmBlocks(measure=counting(("rows", 512)), path=path)
    assert first.callable_for(node) is not None and len(asked) == 1
    second = GemmBlocks(measure=counting(None), path=path)  # a new process, the same machine
    assert second.callable_for(node).__name__ == "mm_rows_of_512" and len(asked) == 1
    other = node_of(mm_graph(512, 256, 8192))
    assert second.callable_for(other) is None and len(asked) == 2  # added to the file
    third = GemmBlocks(measure=counting(("cols", 1024)), path=path)
    assert third.callable_for(node) is not None and third.callable_for(other) is None
    assert len(asked) == 2
    data = json.loads(path.read_text())
    assert sorted(map(str, data["chosen"].values())) == ["None", "['rows', 512]"]


@pytest.mark.parametrize("damage", ["not json {", "[]", '{"machine": "another", "chosen": {}}',
                                    "entry"])
def test_a_damaged_or_foreign_file_is_measured_again(tmp_path, damage):
    path = tmp_path / "gemm-blocks.json"
    node = node_of(mm_graph(512, 256, 4096))
    GemmBlocks(measure=lambda a, b, bias: ("cols", 512), path=path).callable_for(node)
    if damage == "entry":  # a value that is no choice: measured again, never called
        data = json.loads(path.read_text())
        data["chosen"] = {k: ["cols", 7] for k in data["chosen"]}
        path.write_text(json.dumps(data))
    else:
        path.write_text(damage)
    asked = []
    blocks = GemmBlocks(measure=lambda a, b, bias: asked.append(1) or None, path=path)
    assert blocks.callable_for(node) is None and asked == [1]


def test_an_unwritable_cache_directory_costs_only_the_keeping(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    blocks = GemmBlocks(measure=lambda a, b, bias: ("cols", 512),
                        path=blocker / "gemm-blocks.json")
    assert blocks.callable_for(node_of(mm_graph(512, 256, 4096))) is not None


def test_a_failing_measurement_leaves_the_product_whole(caplog):
    def broken(a, b, bias):
        raise RuntimeError("out of memory")
    blocks = GemmBlocks(measure=broken)
    with caplog.at_level("WARNING", logger="torchloom.runtime"):
        assert blocks.callable_for(node_of(mm_graph(512, 256, 4096))) is None
    assert "out of memory" in caplog.text


def test_measured_on_the_cpu_under_a_device_context():
    a = TensorType.make((512, 256), "f32")
    b = TensorType.make((256, 4096), "f32")
    with torch.device("meta"):
        blocks = measure(a, b, (4096,))
    assert blocks is None or blocks[0] in ("cols", "rows")


@pytest.mark.parametrize("blocks_faster", [False, True])
def test_timing_stops_early_where_no_block_is_faster(monkeypatch, blocks_faster):
    """Every block slower than the whole call after ``EARLY_ROUNDS`` rounds: timing stops
    there (none would be ``MIN_GAIN`` faster); a block faster: every round is timed."""
    from torchloom.codegen import gemm
    calls = []

    def timed(fn):  # each round times the whole call first, then the blocks
        fn()
        calls.append(fn)
        whole = (len(calls) - 1) % 3 == 0
        return 1.0 if whole else (0.5 if blocks_faster else 2.0)
    monkeypatch.setattr(gemm, "_seconds", timed)
    a = TensorType.make((256, 256), "f32")
    b = TensorType.make((256, 4096), "f32")  # the whole call and two column blocks
    blocks = gemm.measure(a, b)
    rounds = gemm.ROUNDS if blocks_faster else gemm.EARLY_ROUNDS
    assert len(calls) == 3 * rounds
    if not blocks_faster:
        assert blocks is None
