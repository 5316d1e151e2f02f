"""Inputs eager handles that a compiler can get wrong: transposed, sliced, expanded (stride 0)
and channels_last inputs, inputs that alias each other, outputs that are inputs or views of
them, in-place updates (of views too), 0-size and size-1 dims, 0-d tensors, bool arithmetic,
integer wrap-around and integer division by zero (eager raises ZeroDivisionError; so must
the compiled graph). Static and dynamic shapes; compared with eager (values and strides),
every graph compiled by torchloom (no eager fallback)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchloom.compiler import Compiler


def gen():
    return torch.Generator().manual_seed(0)


def randn(*shape):
    return lambda g: torch.randn(*shape, generator=g)


CASES = {  # name: (function, inputs from a generator)
    "transposed": (lambda x: (x.sin() + 1, x.sum(0)), lambda g: (torch.randn(6, 5, generator=g).t(),)),
    "expanded": (lambda x, y: (x * y).sum(-1),
                 lambda g: (torch.randn(1, 5, generator=g).expand(4, 5), torch.randn(4, 5, generator=g))),
    "stride0_only": (lambda x: x.exp(), lambda g: (torch.randn(5, generator=g).expand(3, 5),)),
    "sliced": (lambda x: x.relu() * 2, lambda g: (torch.randn(8, 10, generator=g)[::2, 1::3],)),
    "channels_last": (lambda x, w: (F.relu(x) * w).mean((2, 3)),
                      lambda g: (torch.randn(2, 3, 4, 5, generator=g).to(
                          memory_format=torch.channels_last), torch.randn(1, 3, 1, 1, generator=g))),
    "channels_last_out": (lambda x: torch.sigmoid(x) + x, lambda g: (torch.randn(
        2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),)),
    "zero_rows": (lambda x: (x.sin(), x.sum(1), x.sum(0), x.mean(0), x.prod(0)),
                  lambda g: (torch.randn(0, 4, generator=g),)),
    "size_one_broadcast": (lambda x, y: (x + y).softmax(-1),
                           lambda g: (torch.randn(1, 1, 7, generator=g), torch.randn(5, 1, 1, generator=g))),
    "aliasing_inputs": (lambda x, y: x * 2 + y,
                        lambda g: (lambda b: (b[:8], b[2:]))(torch.randn(10, generator=g))),
    "outputs_view_inputs": (lambda x: (x.view(2, 3), x.t(), x[0], x + 1, x),
                            lambda g: (torch.randn(3, 2, generator=g),)),
    "in_place": (lambda x, y: (x.add_(1), y.mul_(x)),
                 lambda g: (torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g))),
    "in_place_view": (lambda x: x[:, 0].mul_(2).sum(), lambda g: (torch.randn(3, 4, generator=g),)),
    "bool_arithmetic": (lambda a, b: (a + b, a * b, a.sum(), (a & b).float().mean(), a.int() - b.int()),
                        lambda g: (torch.randn(6, generator=g) > 0, torch.randn(6, generator=g) > 0.3)),
    "zero_d": (lambda x, s: (x * s, s.exp(), x.sum() + s),
               lambda g: (torch.randn(4, 3, generator=g), torch.randn((), generator=g))),
    "int32_wraps": (lambda x: (x * 1000003, x + 2 ** 31 - 1, x.sum()),
                    lambda g: (torch.randint(-2 ** 31, 2 ** 31 - 1, (64,), generator=g,
                                             dtype=torch.int32),)),
    "int_division": (lambda x: (x.float() / 3, x // 3, x % -3, torch.fmod(x, -3), x.abs()),
                     lambda g: (torch.randint(-100, 100, (16,), generator=g),)),
    "half_sums": (lambda x: (x.sum(), x.mean(-1), x.softmax(-1)),
                  lambda g: (torch.randn(4, 4096, generator=g).half(),)),
}


def run(fn, make, dynamic):
    """(eager result, eager inputs after the call, compiled result, compiled inputs after)."""
    want_in, got_in = make(gen()), make(gen())
    want = fn(*want_in)
    torch._dynamo.reset()
    compiler = Compiler("default")
    got = torch.compile(fn, backend="torchloom", options={"compiler": compiler},
                        dynamic=dynamic)(*got_in)
    assert compiler.compilations
    for comp in compiler.compilations:
        assert comp.fallback_reason is None, comp.fallback_reason
    return want, want_in, got, got_in


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_matches_eager_values_and_strides(name, dynamic):
    fn, make = CASES[name]
    want, want_in, got, got_in = run(fn, make, dynamic)
    tol = {"rtol": 1e-3, "atol": 1e-3} if name == "half_sums" else {}
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    torch.testing.assert_close(got_in, want_in, equal_nan=True)  # in-place updates
    for g, w in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, want))):
        if w.numel() > 1:
            assert g.stride() == w.stride(), (g.stride(), w.stride())
    torch._dynamo.reset()


@pytest.mark.parametrize("op", [lambda a, b: a // b, lambda a, b: a % b, torch.fmod])
def test_integer_division_by_zero_raises_as_in_eager(op):
    a, b = torch.tensor([3, 4, 5]), torch.tensor([1, 0, 2])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(a, b)
    torch._dynamo.reset()
    compiled = torch.compile(op, backend="torchloom", options={"compiler": Compiler("default")})
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, b)
    torch._dynamo.reset()


def test_input_with_its_negative_bit_set_gives_eagers_values():
    """``z.conj().imag`` is a view whose negation torch applies lazily (``is_neg()``): a
    kernel reading its memory would compute with the values negated, so such a graph runs
    eagerly (hostile tester, session 29)."""
    g = gen()
    x = torch.randn(16, 32, dtype=torch.cfloat, generator=g).conj().imag
    w = torch.randn(16, 32, generator=g)
    assert x.is_neg()

    def fn(x, w):
        return torch.exp(x - w) * 2 + x.sin()
    torch._dynamo.reset()
    compiler = Compiler("default")
    got = torch.compile(fn, backend="torchloom", options={"compiler": compiler})(x, w)
    torch.testing.assert_close(got, fn(x, w))
    assert any("negative bit" in (c.fallback_reason or "") for c in compiler.compilations)
    torch._dynamo.reset()


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_call_under_a_fake_tensor_mode_runs_the_original_graph(dynamic):
    """A fake tensor has no memory for a kernel to read (its data pointer is garbage: the
    process crashed): a plan called under a fake tensor mode runs its original graph, whose
    ops give fake results of eager's shapes; real calls after it run the kernels again."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    def f(x, w):
        return torch.exp(x - w) * 2 + x.sin(), (x * w).sum(-1)
    torch._dynamo.reset()
    compiler = Compiler("default", compile_cache=False)
    compiled = torch.compile(f, backend="torchloom", dynamic=dynamic,
                             options={"compiler": compiler})
    g = gen()
    for rows in (6, 9, 12):
        x, w = torch.randn(rows, 8, generator=g), torch.randn(rows, 8, generator=g)
        torch.testing.assert_close(compiled(x, w), f(x, w))
    assert all(c.compiled.fallback_calls == 0 for c in compiler.compilations)
    with FakeTensorMode():
        x, w = torch.randn(12, 8), torch.randn(12, 8)
        fakes = compiled(x, w)
        expected = f(x, w)
    assert all(isinstance(t, FakeTensor) for t in fakes)
    assert [t.shape for t in fakes] == [t.shape for t in expected]
    assert sum(c.compiled.fallback_calls for c in compiler.compilations) == 1
    x, w = torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)
    torch.testing.assert_close(compiled(x, w), f(x, w))
    assert sum(c.compiled.fallback_calls for c in compiler.compilations) == 1
    torch._dynamo.reset()
