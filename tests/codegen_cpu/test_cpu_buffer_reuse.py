"""Buffer reuse with the cpu codegen's kernels (codegen/buffers.py, launcher ``into``):
through torch.compile, forward and backward match eager while kernels write into dead
buffers (the forward's intermediates, the backward's donated saved activations, in place
where the C kernel reads an element before writing it); inputs the user holds are never
written."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler

N = 256  # f32[256, 256]: 256 KB, large enough to be reused


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("reuse-cache")


def compile_with(fn, cache_dir):
    compiler = Compiler("default", cache_dir=cache_dir, compile_cache=False, strict=True)
    torch._dynamo.reset()
    return torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler})), compiler


def test_mlp_step_writes_into_dead_buffers_and_matches_eager(cache_dir):
    torch.manual_seed(0)  # the issue's MLP block (LayerNorm, Linear, GELU, Linear, residual)
    model = torch.nn.Sequential(torch.nn.LayerNorm(256), torch.nn.Linear(256, 512),
                                torch.nn.GELU(), torch.nn.Linear(512, 256))
    reference = copy.deepcopy(model)
    compiled, compiler = compile_with(lambda x: x + model(x), cache_dir)
    for _ in range(3):  # later steps run with the buffers the first one freed
        x = torch.randn(N, 256)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya = compiled(xa)
        ya.sum().backward()
        yb = xb + reference(xb)
        yb.sum().backward()
        torch.testing.assert_close(ya, yb)
        torch.testing.assert_close(xa, x)  # the user's input is never written
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-4)
        for (name, a), b in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4, msg=name)
    forward, backward = (c.compiled for c in compiler.compilations)
    assert forward.plan.reuse.count >= 1  # GELU's group writes the fc1 matmul in place
    donated = {v for v in backward.plan.reuse.held if v.producer is None}
    assert donated, backward.source  # a saved activation's buffer takes a gradient
    torch._dynamo.reset()


def test_cross_entropy_gradient_written_over_the_saved_log_probabilities(cache_dir):
    """A language model's loss (issue 41): the logits ``f32[1, 128, 1024]``, cross entropy
    over their ``f32[128, 1024]`` view. The backward's one kernel (the log_softmax gradient
    of the loss's) writes its ``f32[1, 128, 1024]`` result over the saved log-probabilities
    (donated, read by that kernel only, dense with as many elements), not into fresh pages."""
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 1024, bias=False)  # (a bias: its column sums in the kernel)
    reference = copy.deepcopy(head)
    labels = torch.randint(0, 1024, (128,))

    def loss(model, h):
        logits = model(h)
        return torch.nn.functional.cross_entropy(logits.view(-1, 1024), labels), logits

    compiled, compiler = compile_with(lambda h: loss(head, h), cache_dir)
    for _ in range(2):
        h = torch.randn(1, 128, 64)
        ha, hb = h.clone().requires_grad_(), h.clone().requires_grad_()
        (la, _), (lb, _) = compiled(ha), loss(reference, hb)
        la.backward()
        lb.backward()
        torch.testing.assert_close(la, lb)
        torch.testing.assert_close(ha.grad, hb.grad)
        torch.testing.assert_close(head.weight.grad, reference.weight.grad)
        head.zero_grad(), reference.zero_grad()
    backward = compiler.compilations[-1].compiled
    saved = [v for v in backward.plan.reuse.held if v.producer is None]
    assert [v.type.shape for v in saved] == [(128, 1024)], backward.source
    torch._dynamo.reset()


def test_user_inputs_are_never_written(cache_dir):
    def f(x, y):  # both groups could write in place into x, were it their own
        m = (torch.tanh(x) * 2) @ y
        return torch.sigmoid(m) + x

    compiled, compiler = compile_with(f, cache_dir)
    x, y = torch.randn(N, N), torch.randn(N, N)
    keep = x.clone(), y.clone()
    with torch.no_grad():
        got = compiled(x, y)
    torch.testing.assert_close(got, f(*keep))
    torch.testing.assert_close((x, y), keep)
    plan = compiler.compilations[-1].compiled.plan
    assert plan.reuse.count >= 1  # the intermediates are reused, in place
    assert not any(v.producer is None for v in plan.reuse.held)
    assert got.data_ptr() not in (x.data_ptr(), y.data_ptr())
    torch._dynamo.reset()


def group(body: str, cols: int = 64) -> str:
    return (f"graph @g(%x: f32[64, {cols}], %y: f32[{cols}]) {{\n"
            f"  %o = torchloom.fusion_group(%x, %y) : f32[64, {cols}] "
            f"region @k(%in_x: f32[64, {cols}], %in_y: f32[{cols}]) {{\n"
            f"{body}\n  }}\n  return %o\n}}")


@pytest.mark.parametrize("body, pairs", [
    # pointwise, same type: the input's element is read before the output's is written
    ("    %a = aten.exp.default(%in_x) : f32[64, 64]\n"
     "    %b = aten.add.Tensor(%a, %in_y) : f32[64, 64]\n    return %b",
     [[0, 0]]),
    # a view inside the group: the input is read at other coordinates than written
    ("    %t = aten.t.default(%in_x) : f32[64, 64] strided[1, 64]\n"
     "    %b = aten.exp.default(%t) : f32[64, 64]\n    return %b",
     []),
    # a reduction over rows: its sum reads the row, then the last loop reads each element
    # before it writes it (issue 41: a cross entropy's gradient over the saved log-probs)
    ("    %s = aten.sum.dim_IntList(%in_x) {dim = [1], keepdim = true} : f32[64, 1]\n"
     "    %b = aten.sub.Tensor(%in_x, %s) : f32[64, 64]\n    return %b",
     [[0, 0]]),
    # the same over a column (dim 0: each thread's columns over every row): not in place
    ("    %s = aten.sum.dim_IntList(%in_x) {dim = [0], keepdim = true} : f32[1, 64]\n"
     "    %b = aten.sub.Tensor(%in_x, %s) : f32[64, 64]\n    return %b",
     []),
    # a second reduction reads the input after the row's output is written
    ("    %s = aten.sum.dim_IntList(%in_x) {dim = [1], keepdim = true} : f32[64, 1]\n"
     "    %b = aten.sub.Tensor(%in_x, %s) : f32[64, 64]\n"
     "    %m = aten.amax.default(%b) {dim = [1], keepdim = true} : f32[64, 1]\n"
     "    %c = aten.mul.Tensor(%in_x, %m) : f32[64, 64]\n"
     "    %d = aten.add.Tensor(%b, %c) : f32[64, 64]\n    return %d",
     None),
])
def test_in_place_pairs_of_the_c_kernel(registry, codegen, body, pairs):
    graph = parse_graph(group(body))
    node = next(n for n in graph.nodes if n.region is not None)
    generated = codegen.generate(node, registry)
    if pairs is None:  # safe either way: the row's last loop reads x before writing d
        pairs = generated.metadata["inplace"]
        assert pairs in ([], [[0, 0]])
    assert generated.metadata["inplace"] == pairs
    signature = next(line for line in generated.source.splitlines()
                     if line.startswith("void fused_"))
    # the pair's pointers lose restrict (the compiler keeps the read before the write)
    assert ("restrict in_in_x" in signature) == (not pairs)
    assert "restrict in_in_y" in signature


def reshaped(body: str, out: str) -> str:
    return (f"graph @g(%x: f32[8, 64], %y: f32[64]) {{\n"
            f"  %o = torchloom.fusion_group(%x, %y) : {out} "
            f"region @k(%in_x: f32[8, 64], %in_y: f32[64]) {{\n"
            f"{body}\n  }}\n  return %o\n}}")


@pytest.mark.parametrize("body, out, pairs", [
    # a matmul's output read as [batch, tokens, features]: each element where it is
    ("    %v = aten.view.default(%in_x) {size = [2, 4, 64]} : f32[2, 4, 64]\n"
     "    %a = aten.add.Tensor(%v, %in_y) : f32[2, 4, 64]\n"
     "    %g = aten.gelu.default(%a) : f32[2, 4, 64]\n    return %g",
     "f32[2, 4, 64]", [[0, 0]]),
    # a reshape that moves the rows' boundaries keeps the elements' order too
    ("    %v = aten.view.default(%in_x) {size = [16, 32]} : f32[16, 32]\n"
     "    %g = aten.exp.default(%v) : f32[16, 32]\n    return %g",
     "f32[16, 32]", [[0, 0]]),
    # reshaped, then transposed: read at other places than written
    ("    %v = aten.view.default(%in_x) {size = [16, 32]} : f32[16, 32]\n"
     "    %t = aten.t.default(%v) : f32[32, 16] strided[1, 32]\n"
     "    %g = aten.exp.default(%t) : f32[32, 16]\n    return %g",
     "f32[32, 16]", []),
    # broadcast along a dim of the output: more elements than the input holds
    ("    %v = aten.view.default(%in_x) {size = [8, 1, 64]} : f32[8, 1, 64]\n"
     "    %e = aten.expand.default(%v) {size = [8, 2, 64]} : f32[8, 2, 64] strided[64, 0, 1]\n"
     "    %g = aten.exp.default(%e) : f32[8, 2, 64]\n    return %g",
     "f32[8, 2, 64]", []),
])
def test_a_reshaped_input_is_written_in_place(registry, codegen, body, out, pairs):
    node = next(n for n in parse_graph(reshaped(body, out)).nodes if n.region is not None)
    kernel = codegen.load(codegen.generate(node, registry), registry)
    assert sorted(map(list, kernel.inplace)) == pairs
    x, y = torch.randn(8, 64), torch.randn(64)
    fresh, = kernel(x.clone(), y)
    if pairs:  # given the input's buffer, the same values as in fresh memory
        buffer = x.clone()
        got, = kernel.into((buffer.view(fresh.shape),), buffer, y)
        assert got.data_ptr() == buffer.data_ptr()
        torch.testing.assert_close(got, fresh, atol=0, rtol=0)


def test_gelu_of_a_reshaped_matmul_output_writes_over_it(cache_dir):
    """ViT's MLP (issue 41): ``gelu(x @ w.t() + b)`` with the tokens of two images,
    the matmul ``f32[394, 1024]`` read as ``f32[2, 197, 1024]``: the kernel writes its
    result over the matmul's output, eager's values."""
    torch.manual_seed(0)
    fc = torch.nn.Linear(256, 1024)
    compiled, compiler = compile_with(lambda h: torch.nn.functional.gelu(fc(h)), cache_dir)
    for _ in range(2):
        h = torch.randn(2, 197, 256)
        with torch.no_grad():
            torch.testing.assert_close(compiled(h), torch.nn.functional.gelu(fc(h)))
    plan = compiler.compilations[-1].compiled.plan
    held = [v for v in plan.reuse.held if v.producer is not None]
    source = compiler.compilations[-1].compiled.source
    assert [v.producer.op for v in held] == ["aten.mm.default"], source
    torch._dynamo.reset()


@pytest.mark.parametrize("cols, pairs", [(64, [[0, 0]]), (13, [[0, 0]]), (23, [])])
def test_rows_run_past_their_end_are_never_in_place(registry, codegen, cols, pairs):
    """Rows of 23 run as whole 8-lane vectors past the row's end (overrun.py): the lanes
    past it write the next row's first elements, which that row would then read
    overwritten were the output the input's buffer. Rows of 13 (scalar loops) stay in
    their row."""
    body = (f"    %s = aten.sum.dim_IntList(%in_x) {{dim = [1], keepdim = true}} : f32[64, 1]\n"
            f"    %b = aten.sub.Tensor(%in_x, %s) : f32[64, {cols}]\n    return %b")
    node = next(n for n in parse_graph(group(body, cols)).nodes if n.region is not None)
    assert codegen.generate(node, registry).metadata["inplace"] == pairs


@pytest.mark.parametrize("cols, in_place", [(64, True), (13, True), (23, False), (1000, False)])
def test_row_kernel_written_in_place_matches_a_fresh_output(registry, codegen, cols, in_place):
    """A row kernel given its input's buffer for its output (``into``) computes what it
    computes into fresh memory. Rows of 23 run past their end (overrun.py); rows of 1000
    end in a masked block that reads again elements the blocks before it wrote: neither
    is written in place."""
    body = (f"    %s = aten.sum.dim_IntList(%in_x) {{dim = [1], keepdim = true}} : f32[64, 1]\n"
            f"    %e = aten.exp.default(%in_x) : f32[64, {cols}]\n"
            f"    %b = aten.sub.Tensor(%e, %s) : f32[64, {cols}]\n    return %b")
    node = next(n for n in parse_graph(group(body, cols)).nodes if n.region is not None)
    kernel = codegen.load(codegen.generate(node, registry), registry)
    assert ((0, 0) in kernel.inplace) == in_place
    x, y = torch.randn(64, cols), torch.randn(cols)
    # against float64: a float32 sum of 1000 elements in SIMD lanes (8 with AVX2, 16 with
    # AVX-512) rounds otherwise than torch's cascade sum, by a few ulp of the row's sum
    want = torch.exp(x.double()) - x.double().sum(1, keepdim=True)
    fresh, = kernel(x.clone(), y)
    torch.testing.assert_close(fresh.double(), want, atol=1e-4, rtol=1e-5)
    if in_place:
        buffer = x.clone()
        got, = kernel.into((buffer,), buffer, y)
        assert got.data_ptr() == buffer.data_ptr()
        torch.testing.assert_close(got, fresh, atol=0, rtol=0)  # the same program's values


UNARY = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "sin": torch.sin,
         "affine": lambda a: a * 2 + 1}
BINARY = {"add": torch.add, "mul": torch.mul, "sub": torch.sub,
          "mm": torch.mm}


@st.composite
def programs(draw):
    """Steps ``(op, argument indices)`` over three inputs (mostly reading the last values:
    chains of groups cut by matmuls, whose dead buffers later groups take), then which
    values are returned."""
    steps = []
    for i in range(draw(st.integers(3, 8))):
        count = 3 + i
        recent = st.integers(max(0, count - 3), count - 1)
        if draw(st.integers(0, 2)) == 0:
            steps.append(("mm", (draw(recent), draw(st.integers(0, count - 1)))))
        elif draw(st.booleans()):
            steps.append((draw(st.sampled_from(sorted(UNARY))), (draw(recent),)))
        else:
            steps.append((draw(st.sampled_from(sorted(BINARY))), (draw(recent), draw(recent))))
    returned = draw(st.lists(st.integers(3, 3 + len(steps) - 1), min_size=1, max_size=2,
                             unique=True))
    return steps, returned


def run_program(steps, returned, *inputs):
    values = list(inputs)
    for op, args in steps:
        values.append((UNARY.get(op) or BINARY[op])(*(values[a] for a in args)))
    return tuple(values[i] for i in returned)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(programs(), st.integers(0, 2**16))
# a = x @ y; b = sigmoid(a); b @ a: a is read after the group, which must not write it
@example(([("mm", (0, 1)), ("sigmoid", (3,)), ("mm", (4, 3))], [5]), 0)
# a matmul between groups: the second group takes the first's dead buffer
@example(([("tanh", (0,)), ("mm", (3, 1)), ("affine", (4,)), ("add", (5, 2))], [6]), 0)
def test_random_programs_match_eager_forward_and_backward(cache_dir, program, seed):
    steps, returned = program
    torch.manual_seed(seed)
    inputs = [torch.randn(N, N) / 16 for _ in range(3)]  # matmuls keep values near 1

    def f(x, y, z):
        return run_program(steps, returned, x, y, z)

    compiled, compiler = compile_with(f, cache_dir)
    # chains of matmuls over 256 terms amplify the kernels' last-ulp differences (libm vs
    # eager's SLEEF): 5 elements of 65,536 reached 7e-4 in a gradient; a buffer written
    # while still read gives differences of the values' own size (~1)
    tol = {"rtol": 2e-3, "atol": 2e-3}
    with torch.no_grad():  # inference: no activation is saved, intermediates die early
        torch.testing.assert_close(compiled(*inputs), f(*inputs), **tol)
    ours = [x.clone().requires_grad_() for x in inputs]
    theirs = [x.clone().requires_grad_() for x in inputs]
    for _ in range(2):
        for t in (*ours, *theirs):
            t.grad = None
        got, want = compiled(*ours), f(*theirs)
        torch.testing.assert_close(got, want, **tol)
        sum(g.sum() for g in got).backward()
        sum(w.sum() for w in want).backward()
        for a, b, x in zip(ours, theirs, inputs):
            torch.testing.assert_close(a, x)  # never written
            if b.grad is not None:
                torch.testing.assert_close(a.grad, b.grad, **tol)
    torch._dynamo.reset()
