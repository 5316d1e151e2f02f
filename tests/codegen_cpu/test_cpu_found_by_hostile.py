"""Differences from eager hostile testers found, end to end through ``torch.compile``:
a NaN clamp bound ignored, ``x ** -0.5`` computed with pow where eager takes rsqrt, and a
float -> int -> float round trip giving -0.0 (gcc folds ``(float)(int)x`` into
``trunc(x)``) (session 18); the variance and mean of f64 rows whose sum overflows (a row
of 1e308: inf where eager gives 0 and 1e308), and softmax gradients of masked elements
(+0.0 where eager's ``y * (g - sum)`` gives -0.0) (session 19). Values and signs of zero
compared exactly where eager's arithmetic is followed."""

from __future__ import annotations

import pytest
import torch

from conftest import codegens, compiled

NAN, INF = float("nan"), float("inf")
SPECIALS = [NAN, INF, -INF, -0.0, 0.0, -0.5, 0.5, -1.5, 2.5, 1e-40, -3e38, 7.0, -7.0]
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal values, NaN where eager has NaN, and the same sign of every zero (a NaN's
    sign bit means nothing)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    numbers = ~want.isnan()
    assert torch.equal(torch.signbit(got[numbers]), torch.signbit(want[numbers])), (got, want)


def values(dtype: torch.dtype, n: int) -> torch.Tensor:
    """``n`` values cycling through SPECIALS (a vector body and a scalar remainder)."""
    return torch.tensor([SPECIALS[i % len(SPECIALS)] for i in range(n)]).to(dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bound", [NAN, -INF, 0.0, -0.0])
def test_clamp_bounds_as_eager(tmp_path, dtype, bound):
    fns = {
        "clamp_min": lambda x: x.clamp(min=bound),
        "clamp_max": lambda x: x.clamp(max=bound),
        "clamp_both": lambda x: x.clamp(bound, 1.0) * 2,
        "clamp_upper_nan": lambda x: x.clamp(-1.0, bound) + 1,
        "hardtanh": lambda x: torch.nn.functional.hardtanh(x, bound, 1.0),
        "hardtanh_upper": lambda x: torch.nn.functional.hardtanh(x, -2.0, bound),
    }
    x = values(dtype, 37)
    for name, fn in fns.items():
        if name.startswith("hardtanh") and bound == bound and (
                bound > 1.0 or name == "hardtanh_upper" and bound < -2.0):
            continue  # eager rejects min_val > max_val
        _, compiled_fn = compiled(fn, tmp_path / name)
        same(compiled_fn(x), fn(x))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("exponent", [-0.5, 0.5, -1, -2, 2, 3])
def test_pow_special_exponents_as_eager(tmp_path, dtype, exponent):
    fn = lambda x: x ** exponent  # noqa: E731
    x = values(dtype, 29)
    _, compiled_fn = compiled(fn, tmp_path)
    got, want = compiled_fn(x), fn(x)
    if dtype == torch.float32:
        same(got, want)
    else:  # f64: eager's pow where the kernel takes sqrt (1 ulp); bf16/f16: one rounding
        torch.testing.assert_close(got, want, equal_nan=True)
        zeros = want == 0
        assert torch.equal(torch.signbit(got[zeros]), torch.signbit(want[zeros]))


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 6, 16, 17, 40])
@pytest.mark.parametrize("ints", [torch.int32, torch.int64, torch.int16, torch.int8,
                                  torch.uint8])
@pytest.mark.parametrize("floats", [torch.float32, torch.float64])
def test_float_int_float_round_trip_keeps_positive_zero(tmp_path, n, ints, floats):
    fn = lambda x: x.to(ints).to(floats) * 3  # noqa: E731
    x = torch.tensor([[-0.5, -0.0, 0.5, -0.99, -1.5, 2.5][i % 6] for i in range(n)],
                     dtype=floats)
    _, compiled_fn = compiled(fn, tmp_path)
    same(compiled_fn(x), fn(x))


@pytest.mark.slow
@pytest.mark.parametrize("shape, dim", [((2, 5), -1), ((3, 300), -1), ((6, 40), 0),
                                        ((2, 3, 70), 1)])
@pytest.mark.parametrize("fill", [1e308, -1.5e308, "mixed"])
def test_f64_var_mean_of_rows_whose_sum_overflows(tmp_path, shape, dim, fill):
    """The mean of values near the f64 maximum is summed again as ``x / n`` where the plain
    sum overflows; rows holding inf or NaN keep eager's inf and NaN."""
    if fill == "mixed":
        x = torch.randn(*shape, dtype=torch.float64) * 1e307 + 1e308
        flat = x.view(-1)
        flat[::7] = INF
        flat[3::11] = NAN
    else:
        x = torch.full(shape, fill, dtype=torch.float64)
    for fn in (lambda x: torch.var_mean(x, dim), lambda x: x.std(dim, correction=0),
               lambda x: x.var(dim) + x.mean(dim)):
        _, compiled_fn = compiled(fn, tmp_path)
        got, want = compiled_fn(x), fn(x)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(g, w, equal_nan=True)
            assert torch.equal(g.isinf(), w.isinf()) and torch.equal(g.isnan(), w.isnan())


@pytest.mark.parametrize("dynamic", [False, True])
def test_f64_mean_of_a_row_of_one_infinite_value(tmp_path, dynamic):
    """A row of one value, inf or -inf: its mean is that value (the second walk, from the
    row's first value, gave inf - inf; session 58, found by the symbolic tree tests)."""
    fn = lambda x: torch.var_mean(x, -1, correction=0)  # noqa: E731
    _, compiled_fn = compiled(fn, tmp_path, dynamic=dynamic)
    for rows in (3, 5):
        x = torch.randn(rows, 1, dtype=torch.float64)
        x[0, 0], x[1, 0] = INF, -INF
        for got, want in zip(compiled_fn(x), fn(x)):
            torch.testing.assert_close(got, want, equal_nan=True)
            assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got.isnan(), want.isnan())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n", [3, 8, 17, 33, 1024])
def test_softmax_gradient_of_masked_elements_has_eagers_sign(tmp_path, dtype, n):
    """Eager's CPU softmax backward is ``y * (g - sum(g * y))``: where ``y`` is 0 (an
    element at -inf, or far below the row's maximum) the gradient is a zero with the sign
    of ``g - sum``."""
    torch.manual_seed(n)
    x = torch.randn(4, n, dtype=dtype)
    x[:, 1] = -INF
    x[0, 2] = -3e38
    g = torch.randn(4, n, dtype=dtype)
    _, compiled_fn = compiled(lambda x: torch.softmax(x, -1), tmp_path)
    grads = []
    for fn in (compiled_fn, lambda x: torch.softmax(x, -1)):
        leaf = x.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(leaf), leaf, g)[0])
    got, want = grads
    torch.testing.assert_close(got, want)
    zeros = want == 0
    assert zeros.any() and torch.equal(torch.signbit(got[zeros]), torch.signbit(want[zeros]))


@pytest.mark.parametrize("row, dtype", [
    ([1e30, -1e30, 0.5e30, 1.0], torch.float32),   # the squares pass f32's largest value
    ([3e38, -3e38], torch.float32),                 # the differences do too
    ([-3.28, 1e30], torch.bfloat16),                # computed in f32: alike
    ([1e30, -1e30, 0.5e30, 1.0] * 9, torch.float32),  # a row longer than a vector
])
@pytest.mark.parametrize("rows", [1, 5])
def test_layer_norm_of_rows_whose_variance_overflows_is_nan(tmp_path, row, dtype, rows):
    """Eager's layer_norm gives NaN (for rstd, every element and the gradients) on a short
    row whose variance overflows; the decomposition's rsqrt(inf) = 0 normalized it to
    zeros, which hides exploding activations (issue 40). NaN on every such row (eager's
    vectorized kernel, on rows of 36, gives the silent zeros itself); other rows keep
    eager's values."""
    n = len(row)
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n * rows)).to(dtype)
    x[-1] = torch.tensor(row).to(dtype)
    w = torch.linspace(0.5, 1.5, n)

    def f(x, w):
        return torch.nn.functional.layer_norm(x.float(), (n,), w)

    compiler, fn = compiled(f, tmp_path)
    got, want = fn(x, w), f(x, w)
    assert got[-1].isnan().all() and (n > 16 or want[-1].isnan().all())
    torch.testing.assert_close(got[:-1], want[:-1], equal_nan=True)
    assert "cpu" in codegens(compiler)

    xs, ws = [x.float().clone().requires_grad_() for _ in range(2)], \
        [w.clone().requires_grad_() for _ in range(2)]
    _, train = compiled(lambda x, w: f(x, w).sum(), tmp_path)
    train(xs[0], ws[0]).backward()
    f(xs[1], ws[1]).sum().backward()
    assert xs[0].grad[-1].isnan().all() and ws[0].grad.isnan().all()
    # the other rows' gradients: rows of 2-4 random elements have a large rstd, and the
    # decomposition's order of operations differs from eager's fused kernel: a few ulp of
    # the row's terms, times rstd (measured up to 3.4e-5 relative on unseeded rows)
    torch.testing.assert_close(xs[0].grad[:-1], xs[1].grad[:-1], equal_nan=True,
                               rtol=1e-4, atol=1e-4)
    if n <= 16:  # eager's gradients are NaN where ours are
        assert xs[1].grad[-1].isnan().all() and ws[1].grad.isnan().all()


@pytest.mark.parametrize("row", [[1e308, -1e308, 1e308, 1.7e308], [1.7e308, -1.7e308, 1.0],
                                 [1e308] * 3 + [-1e308] * 5, [-1.7e308, 1.7e308] * 40])
def test_f64_var_of_rows_whose_differences_overflow(tmp_path, row):
    """``x - x0`` overflows on such rows (issue 40): the variance came out NaN where eager's
    is inf, and var_mean's mean -inf where its true value is finite. Now var and std are
    inf, as eager's, and the mean is the true mean (eager's var_mean gives NaN or -inf)."""
    x = torch.tensor([row, [1.0, 2.0] * (len(row) // 2) + [3.0] * (len(row) % 2)],
                     dtype=torch.float64)
    true_mean = torch.tensor([sum(v / len(row) for v in r) for r in x.tolist()],
                             dtype=torch.float64)
    _, var = compiled(lambda x: (x.var(1), x.std(1, correction=0)), tmp_path)
    v, s = var(x)
    assert v[0] == INF and s[0] == INF
    torch.testing.assert_close(v[1:], x[1:].var(1))
    _, var_mean = compiled(lambda x: torch.var_mean(x, 1), tmp_path)
    v, m = var_mean(x)
    assert v[0] == INF
    scale = x.abs().amax(1)  # (a mean that cancels to 0 is exact to the row's scale)
    assert ((m - true_mean).abs() <= 1e-14 * scale).all(), (m, true_mean)


@pytest.mark.parametrize("fn", [lambda x: (x + 1).max(-1), lambda x: x.min(-1),
                                lambda x: (x * 2).max(-1, keepdim=True)[0] + 1,
                                lambda x: x.t().min(0)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_max_and_min_over_an_empty_dim_raise_as_eager(tmp_path, fn, dynamic):
    """``max(dim)``/``min(dim)`` over a dim of size 0: eager raises IndexError (fake
    tensors do not, so the graph reaches the codegens); a kernel returned -inf/inf and
    index 0. The group now runs on eager, which raises (found by a hostile sweep)."""
    compiler, compiled_fn = compiled(fn, tmp_path, dynamic=dynamic)
    if dynamic:  # compiled first at sizes of 2 or more (symbolic)
        compiled_fn(torch.randn(5, 7))
    x = torch.randn(4, 0)
    with pytest.raises(IndexError):
        fn(x)
    with pytest.raises(IndexError, match="non-zero size"):
        compiled_fn(x)
    ok = torch.randn(3, 6)
    torch.testing.assert_close(tuple(compiled_fn(ok)), tuple(fn(ok)))  # other sizes run
