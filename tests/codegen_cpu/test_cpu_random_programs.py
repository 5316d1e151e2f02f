"""Random torch programs end to end (``torch.compile(backend="torchloom")``, the default
pipeline, so CPU groups run on the cpu codegen), compared with eager: size-1 dims, strided
slices of them, reshapes, expands, reductions kept and dropped, dead values and several
outputs (:mod:`torchloom.testing.torch_programs`). 60 programs; ``--fuzz`` runs 10,000.

And the family of issue 40's wrong result: a group holding a reduction over rows of one
element (or broadcast along the row) and an output of the reduced shape computed from an
expensive value (tanh, exp) that two ops read. The row buffer planned for that value was the
output's own row, written inside the row loop, while the value and the output's store did
not depend on the loop and were hoisted before it: the buffer's write then overwrote the
output (``out[0] = tanh(x) * 0.5 + 1 + tanh(x)``, then ``out[0] = tanh(x)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
import torch._dynamo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.testing.torch_programs import WIDE, TorchProgram, draw_program


@attrs.frozen
class hypothesis_draw:
    """A ``torch_programs.Draw`` over hypothesis's ``data.draw`` (shrinks toward the first
    option, the low end and False)."""

    draw: Callable[[Any], Any]

    def pick(self, options):
        return options[self.draw(st.integers(0, len(options) - 1))]

    def integer(self, low, high):
        return self.draw(st.integers(low, high))

    def boolean(self):
        return self.draw(st.booleans())


def _check(program: TorchProgram, inputs=None, dynamic: bool | None = None) -> None:
    f = program.function()
    inputs = program.example_inputs() if inputs is None else inputs
    try:
        want = f(*[x.clone() for x in inputs])
    except RuntimeError:  # eager refuses the program (a shape it cannot take): so may we
        return
    torch._dynamo.reset()
    got = torch.compile(f, backend="torchloom", dynamic=dynamic)(*[x.clone() for x in inputs])
    assert len(got) == len(want), program
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (str(program), k, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True,
                                   msg=lambda m, k=k: f"output {k} of\n{program}\n{m}")


@pytest.mark.slow
def test_random_programs_match_eager(fuzz):
    @settings(max_examples=10_000 if fuzz else 60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def run(data):
        _check(draw_program(hypothesis_draw(data.draw)))
    run()


ISSUE_40 = TorchProgram("""def f(x1):
    v1 = torch.rsqrt(torch.abs(x1) + 1.0)
    v2 = x1[..., ::2]
    v3 = torch.tanh(v2)
    v5 = v2[..., ::2]
    v6 = v3 * 0.5 + 1.0
    v9 = v5.reshape(v5.shape[0], -1)
    v10 = v6 + v3
    v11 = v9.amax(0, keepdim=False)
    return v10, v11
""", ((1, 1),))


def test_issue_40_example():
    x = torch.tensor([[0.25]])
    v10, v11 = torch.compile(ISSUE_40.function(), backend="torchloom")(x)
    t = torch.tanh(x)
    torch.testing.assert_close(v10, t * 0.5 + 1.0 + t)  # 1.3674, was tanh(x) = 0.2449
    torch.testing.assert_close(v11, x[0])


#: the family: an expensive value read twice, an output of the reduced shape, a reduction
FAMILY = [
    ISSUE_40,
    TorchProgram("""def f(x):
    t = torch.tanh(x)
    return t * 0.5 + 1.0 + t, x.amax(0)
""", ((1, 8),)),
    TorchProgram("""def f(x):
    e = torch.exp(-torch.abs(x))
    return e * e + e, x.sum(-1, keepdim=True)
""", ((8, 1),)),
    TorchProgram("""def f(x, b):
    t = torch.sigmoid(b.expand(x.shape))
    return t * x + t, x.mean(1)
""", ((4, 8), (4, 1))),
    TorchProgram("""def f(x):
    v = x[:, ::2]
    t = torch.tanh(v)
    return (t + 1.0) * t, v.reshape(v.shape[0], -1).amin(0), torch.softmax(v, 0)
""", ((1, 5),)),
]


def _shapes_with_ones(shape: tuple[int, ...]):
    """Every shape that has 1 in place of some of ``shape``'s dims."""
    for ones in itertools.product((False, True), repeat=len(shape)):
        yield tuple(1 if one else d for d, one in zip(shape, ones))


@pytest.mark.slow
@pytest.mark.parametrize("k", range(len(FAMILY)))
def test_family_over_every_size_1_combination(k):
    """Each program over its input shapes at full size (7 or 33 per dim, odd: no whole
    vectors) and with every combination of dims set to 1 (broadcast partners alike)."""
    program = FAMILY[k]
    base = tuple(33 if d > 1 else 7 for d in program.shapes[0])
    for shape in _shapes_with_ones(base):
        shapes = [shape] + [tuple(1 if d == 1 else s for d, s in zip(other, shape))
                            for other in program.shapes[1:]]
        for edges in (False, True):
            _check(TorchProgram(program.source, tuple(shapes), seed=len(shapes), edges=edges))


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_wide_random_programs_match_eager(fuzz, dynamic):
    """Programs of :data:`~torchloom.testing.torch_programs.WIDE`: casts through bf16, f16
    and integers, rounding, floor and trunc division, remainders, comparisons and logic,
    special functions, variance, products, log-sum-exp, arg reductions, cumulative sums,
    ``cat``; at ``dynamic=True`` too (every size symbolic)."""
    @settings(max_examples=5_000 if fuzz else 30, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def run(data):
        _check(draw_program(hypothesis_draw(data.draw), ops=WIDE), dynamic=dynamic)
    run()


def _gradients(f, inputs, dtype=None) -> list[torch.Tensor]:
    """The gradients of ``f``'s floating outputs, weighted -1, 0, 1 by element, as a sum,
    with respect to ``inputs`` (in ``dtype``; zeros for an input nothing reads)."""
    xs = [x.clone().to(dtype or x.dtype).requires_grad_() for x in inputs]
    outs = [o for o in f(*xs) if o.requires_grad]
    if not outs:
        return [torch.zeros_like(x) for x in xs]
    total = sum((o * (torch.arange(o.numel()).reshape(o.shape) % 3 - 1)).sum() for o in outs)
    grads = torch.autograd.grad(total, xs, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g.detach() for x, g in zip(xs, grads)]


def _check_gradients(program: TorchProgram) -> None:
    """The compiled backward's gradients against float64's: finite where PyTorch's own
    decomposed graph (``aot_eager``) is, its non-finite values exactly (nan, inf and its
    sign), and elsewhere within 3x the larger of eager's and ``aot_eager``'s error plus
    1e-5 of the scale (an ill-conditioned gradient, such as a reciprocal's of a value
    near 0 through a softmax, is off by percents in any fp32 order)."""
    f = program.function()
    inputs = program.example_inputs()
    try:
        exact = _gradients(f, inputs, torch.float64)
        eager = _gradients(f, inputs)
    except RuntimeError:  # eager refuses the program, or its backward
        return
    sides = {}
    for backend in ("aot_eager", "torchloom"):
        torch._dynamo.reset()
        sides[backend] = _gradients(torch.compile(f, backend=backend), inputs)
    for k, (got, ref, want, e) in enumerate(zip(sides["torchloom"], sides["aot_eager"], exact,
                                                eager)):
        where = f"gradient {k} of\n{program}"
        finite = torch.isfinite(ref)
        assert torch.equal(finite, torch.isfinite(got)), where
        odd = ~finite
        assert ((got[odd] == ref[odd]) | (got[odd].isnan() & ref[odd].isnan())).all(), where
        both = finite & torch.isfinite(want) & torch.isfinite(e)
        if not both.any():
            continue
        want64, scale = want[both], want[both].abs().max().item()
        own = max((e[both].double() - want64).abs().max().item(),
                  (ref[both].double() - want64).abs().max().item())
        error = (got[both].double() - want64).abs().max().item()
        assert error <= 3 * own + 1e-5 * max(scale, 1.0), (where, error, own, scale)


@pytest.mark.slow
def test_wide_random_programs_gradients(fuzz):
    """Training through random programs: every input needs its gradient."""
    @settings(max_examples=2_000 if fuzz else 20, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def run(data):
        _check_gradients(draw_program(hypothesis_draw(data.draw), ops=WIDE))
    run()
