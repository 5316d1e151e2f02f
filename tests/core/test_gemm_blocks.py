"""Matrix products in blocks of columns (torchloom.codegen.gemm): the blocked ``mm`` gives
the whole call's values (every shape, layout, dtype, block width, with and without
``out=``), the plan calls it only for the ``mm`` nodes ``GemmBlocks`` chose (decided once
per shape by a trial of its first calls), through the plan's buffer reuse too, and where
autograd records the product it calls ``mm`` whole. Speed is not asserted here (a
benchmark's, RESULTS.md): the trials run on a scripted clock, and their contract is: every
call gives the product's values, the first call is the whole product, blocks only where
they were ``MIN_GAIN`` faster and gave the whole call's bits."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.codegen import gemm
from torchloom.codegen.gemm import (EARLY_ROUNDS, MAX_ELEMENTS, MAX_MACS, MIN_MACS, ROUNDS,
                                    GemmBlocks, Trial, blocked_addmm, blocked_mm)
from torchloom.codegen.plan import build_function
from torchloom.ir import parse_graph
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
    multiplied by another kernel than the whole; a trial compares the bits of the blocks
    it chooses, see ``test_blocks_only_with_the_whole_calls_bits``)."""
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


class Script:
    """A clock whose calls last as ``seconds(variant)`` says; a trial calls the whole
    product, then each candidate's blocks, in turn (variant 0, 1, ...)."""

    def __init__(self, seconds, variants):
        self.seconds, self.variants, self.now, self.reads = seconds, variants, 0.0, 0

    def __call__(self):
        if self.reads % 2:  # a call's end: it lasted as scripted
            self.now += self.seconds(self.reads // 2 % self.variants)
        self.reads += 1
        return self.now


def decided_blocks(choice, *nodes, **kwargs) -> GemmBlocks:
    """A GemmBlocks where ``nodes``' products were decided ``choice``."""
    blocks = GemmBlocks(**kwargs)
    for node in nodes:
        blocks.settle(blocks.key(node), choice)
    return blocks


def test_only_large_static_dense_products_are_tried():
    blocks = GemmBlocks()
    m, k = 64, 256
    n = -(-MIN_MACS // (m * k))  # the smallest product tried
    assert blocks.callable_for(node_of(mm_graph(m, k, n))) is not None
    assert blocks.callable_for(node_of(mm_graph(m, k, n - 1))) is None  # below MIN_MACS
    big = MAX_MACS // (512 * 256) + 1
    assert blocks.callable_for(node_of(mm_graph(512, 256, big))) is None  # too long
    assert blocks.callable_for(node_of(mm_graph(8192, 8, 8192))) is None  # too much memory
    assert blocks.callable_for(node_of(mm_graph(2048, 2048, 2048))) is None  # too long
    small = node_of(mm_graph(512, 1024, 256))  # sides < MIN_SIDE: no blocks to try
    assert GemmBlocks(onednn=False).callable_for(small) is None
    assert blocks.callable_for(node_of(mm_graph(512, 1024, 256, dtype="f64"))) is None
    assert MAX_ELEMENTS < 2 * 8192 * 8192
    assert blocks.callable_for(node_of(mm_graph(512, 256, 4096, dims=("s0, 256", "256, 4096")
                                                ).replace("s0", "512"))) is not None
    symbolic = mm_graph(512, 256, 4096).replace("f32[512, 256]", "f32[s0, 256]", 1) \
        .replace(": f32[512, 4096]", ": f32[s0, 4096]")
    assert blocks.callable_for(node_of(symbolic)) is None
    gappy = mm_graph(512, 256, 4096, " strided[8192, 1]")  # rows with gaps: not dense
    assert blocks.callable_for(node_of(gappy)) is None
    assert blocks.callable_for(node_of(mm_graph(512, 256, 4096, dtype="i64"))) is None
    assert len(blocks.trials) == 2  # two shapes tried; the equal ones after them share one
    assert GemmBlocks(enabled=False).callable_for(node_of(mm_graph(512, 256, 4096))) is None


def test_tried_once_per_shape_layout_and_threads():
    blocks = GemmBlocks()
    plain, transposed = mm_graph(512, 256, 4096), mm_graph(512, 256, 4096, " strided[1, 256]")
    tried = [blocks.callable_for(node_of(text)) for text in (plain, plain, transposed)]
    assert tried[0].__self__ is tried[1].__self__ is not tried[2].__self__
    assert [key[3] for key in blocks.trials] == [(4096, 1), (1, 256)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        blocks.callable_for(node_of(plain))
    finally:
        torch.set_num_threads(threads)
    assert len(blocks.trials) == 3


def run_trial(seconds, calls, *, bias=None, m=64, n=4096, perturb=False):
    """A trial of ``[m, 256] x [256, n]`` driven ``calls`` times on a scripted clock:
    (what it settled, the trial, whether each call gave the whole product's bits, whether
    the library's product in blocks of 512 columns gives them)."""
    settled = []
    node = node_of(mm_graph(m, 256, n))
    key = GemmBlocks().key(node)
    candidates = [(axis, size) for axis, side in (("cols", n), ("rows", m))
                  for size in gemm.SIZES if 2 * size <= side]
    trial = Trial(key, candidates, lambda k, b: settled.append(b),
                  Script(seconds, 1 + len(candidates)))
    if perturb:  # blocks a bit off the whole call's bits
        trial.variants = [trial.variants[0], *[
            (lambda f: lambda *a, **k: f(*a, **k).add_(1e-3))(f) for f in trial.variants[1:]]]
    a, b = operands(m, 256, n, torch.float32, True)
    c = torch.randn(n)
    want = torch.mm(a, b) if bias is None else torch.addmm(c, a, b)
    bias_ = None if bias is None else c
    same = torch.equal(blocked_addmm(("cols", 512))(bias_, a, b), want)
    exact = []
    for _ in range(calls):
        got = trial.mm(a, b) if bias is None else trial.addmm(c, a, b)
        exact.append(torch.equal(got, want))
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)  # blocks' values
    return settled, trial, exact, same


@pytest.mark.parametrize("bias", [None, (4096,)])
def test_blocks_only_where_faster_and_with_the_whole_calls_bits(bias):
    count = 1 + 2  # the whole call, blocks of 512 and of 1,024 columns
    calls = count * (1 + ROUNDS) + 1  # warm-up, timed rounds, the check
    settled, trial, exact, same = run_trial(lambda v: 1.0 if v == 0 else 0.5 + 0.1 * v,
                                            calls + 2, bias=bias)
    assert settled == [("cols", 512) if same else None]
    assert trial.calls == count * (1 + ROUNDS)
    assert (trial.decided is gemm._whole) is not same
    assert all(exact) is same
    # off by a little: never taken
    settled, trial, exact, _ = run_trial(lambda v: 1.0 if v == 0 else 0.5, calls + 2, bias=bias,
                                      perturb=True)
    assert settled == [None] and trial.decided is gemm._whole
    assert exact[calls - 1:] == [True] * 3 and not all(exact)  # the check's call: whole
    # at most MIN_GAIN faster: whole
    settled, trial, _, _ = run_trial(lambda v: 1.0 if v == 0 else gemm.MIN_GAIN + 0.01, calls)
    assert settled == [None] and trial.calls == count * (1 + ROUNDS)


def test_a_trial_stops_early_where_no_block_is_faster():
    count = 3
    settled, trial, exact, _ = run_trial(lambda v: 1.0 if v == 0 else 2.0, 40)
    assert settled == [None] and trial.calls == count * (1 + EARLY_ROUNDS)
    assert all(exact[trial.calls:])
    assert trial.decided is gemm._whole  # calls after it are the whole product


def test_a_trials_first_call_is_the_whole_product_and_recording_calls_are_not_timed():
    settled, trial, _, _ = run_trial(lambda v: 1.0, 1)
    assert trial.calls == 1 and not settled
    a, b = operands(64, 256, 4096, torch.float32, True)
    a.requires_grad_()
    with MatrixProducts() as counted:
        got = trial.mm(a, b)
    assert counted.calls == 1 and got.grad_fn is not None and trial.calls == 1


def test_a_failing_block_leaves_the_product_whole(caplog):
    settled, trial, _, _ = run_trial(lambda v: 1.0, 0)

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")
    trial.variants = [trial.variants[0], broken, broken]
    a, b = operands(64, 256, 4096, torch.float32, True)
    with caplog.at_level("WARNING", logger="torchloom.runtime"):
        for _ in range(3):
            assert torch.equal(trial.mm(a, b), torch.mm(a, b))
    assert settled == [None] and "out of memory" in caplog.text


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
    graph = parse_graph(text)
    blocks = decided_blocks(("cols", 512), next(n for n in graph.nodes if n.op == gemm.MM),
                            onednn=False)
    plan = build_function(graph, registry, calls=blocks.callable_for)
    assert not blocks.trials  # y and w: the shape decided; z: 512 x 256, too narrow
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


def test_the_plan_tries_a_product_in_its_own_calls(registry):
    """No product is timed when the plan is built; its first call is the whole product,
    the next ones the trial's variants, and the decision holds for every later call."""
    text = mm_graph(64, 256, 4096)
    blocks = GemmBlocks(clock=Script(lambda v: 1.0 if v == 0 else 0.5, 3), onednn=False)
    plan = build_function(parse_graph(text), registry, calls=blocks.callable_for)
    assert len(blocks.trials) == 1 and not blocks.chosen
    a, b = operands(64, 256, 4096, torch.float32, False)
    want, counts = torch.mm(a, b), []
    for _ in range(3 * (1 + ROUNDS) + 3):
        with MatrixProducts() as counted:
            (got,) = plan.fn(a, b)
        assert torch.equal(got, want)
        counts.append(counted.calls)
    assert counts[:3] == [1, 8, 4]  # whole, 8 blocks of 512 columns, 4 of 1,024
    assert not blocks.trials and len(blocks.chosen) == 1
    check = 3 * (1 + ROUNDS)
    assert counts[check] == 1 + 8  # the check: whole, and the fastest blocks beside it
    assert counts[check + 1:] == [8 if blocks.chosen.popitem()[1] else 1] * 2


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
    graph = parse_graph(text)
    y, z = (n for n in graph.nodes if n.op == gemm.ADDMM)
    blocks = decided_blocks(("cols", 512), y)
    assert blocks.key(z) is None  # z (beta 2) is called whole, untried
    plan = build_function(graph, registry, calls=blocks.callable_for)
    c, a, b = torch.randn(4096), torch.randn(512, 256), torch.randn(4096, 256).t()
    with MatrixProducts(torch.ops.aten.addmm) as counted:
        y, z = plan.fn(c, a, b)
    assert counted.calls == 8 + 1
    assert torch.equal(y, torch.addmm(c, a, b)) and torch.equal(z, torch.addmm(c, a, b, beta=2))


def test_decisions_are_kept_for_the_next_process_on_this_machine(tmp_path):
    path = tmp_path / "cache" / "gemm-blocks.json"
    node, other = node_of(mm_graph(512, 256, 4096)), node_of(mm_graph(512, 256, 8192))
    decided_blocks(("rows", 512), node, path=path)
    second = GemmBlocks(path=path)  # a new process, the same machine
    assert second.callable_for(node).__name__ == "mm_rows_of_512" and not second.trials
    assert isinstance(second.callable_for(other).__self__, Trial)  # undecided: tried
    second.settle(second.key(other), None)  # added to the file
    third = GemmBlocks(path=path)
    assert third.callable_for(node) is not None and third.callable_for(other) is None
    assert not third.trials
    data = json.loads(path.read_text())
    assert sorted(map(str, data["chosen"].values())) == ["None", "['rows', 512]"]


@pytest.mark.parametrize("damage", ["not json {", "[]", '{"machine": "another", "chosen": {}}',
                                    "entry"])
def test_a_damaged_or_foreign_file_is_tried_again(tmp_path, damage):
    path = tmp_path / "gemm-blocks.json"
    node = node_of(mm_graph(512, 256, 4096))
    decided_blocks(("cols", 512), node, path=path)
    if damage == "entry":  # a value that is no choice: tried again, never called
        data = json.loads(path.read_text())
        data["chosen"] = {k: ["cols", 7] for k in data["chosen"]}
        path.write_text(json.dumps(data))
    else:
        path.write_text(damage)
    blocks = GemmBlocks(path=path)
    assert isinstance(blocks.callable_for(node).__self__, Trial)


def test_an_unwritable_cache_directory_costs_only_the_keeping(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    node = node_of(mm_graph(512, 256, 4096))
    blocks = decided_blocks(("cols", 512), node, path=blocker / "gemm-blocks.json")
    assert blocks.callable_for(node).__name__ == "mm_cols_of_512"


def test_a_trial_runs_on_the_cpu_under_a_device_context():
    settled, trial, _, _ = run_trial(lambda v: 1.0 if v == 0 else 0.5, 0)
    a, b = operands(64, 256, 4096, torch.float32, True)
    with torch.device("meta"):
        for _ in range(3 * (1 + ROUNDS) + 1):
            assert torch.equal(trial.mm(a, b), torch.mm(a, b))
    assert len(settled) == 1


def test_threads_calling_one_trial_get_the_products_values_and_one_decision():
    """Calls of several threads at once: one takes part in the trial at a time (the
    others are the whole product, untimed); every value is the product's, the decision
    is made once, and it is the one a single thread makes."""
    import threading
    settled, trial, _, same = run_trial(lambda v: 1.0 if v == 0 else 0.5 + 0.1 * v, 0)
    a, b = operands(64, 256, 4096, torch.float32, True)
    want, errors, wrong = torch.mm(a, b), [], []

    def calls():
        try:
            for _ in range(40):
                got = trial.mm(a, b)
                if not torch.allclose(got, want, rtol=1e-4, atol=1e-3):
                    wrong.append(got)
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
    threads = [threading.Thread(target=calls) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not wrong
    assert settled == [("cols", 512) if same else None]
    assert trial.calls == 3 * (1 + ROUNDS)


def test_deterministic_algorithms_try_nothing():
    settled, trial, _, _ = run_trial(lambda v: 1.0 if v == 0 else 0.5, 0)
    a, b = operands(64, 256, 4096, torch.float32, True)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with MatrixProducts() as counted:
            for _ in range(20):
                assert torch.equal(trial.mm(a, b), torch.mm(a, b))
    finally:
        torch.use_deterministic_algorithms(before)
    assert counted.calls == 40 and trial.calls == 0 and not settled
