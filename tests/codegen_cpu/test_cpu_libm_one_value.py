"""A libm value (sin, log, erf, ...) is one value in every loop and every kernel
(libmvec.py). libmvec's SIMD variants and the scalar functions round differently, and gcc
picks per loop which elements take which: ``h = sin(x) + y; h == h.amax(0)`` found no
maximum in some columns (the column form computes ``h`` in two loops), and amax's gradient
at ``dynamic=True`` (the backward recomputes ``h``) divided by a count of 0: NaN, for sin,
cos, tan, erf, log, log1p, expm1 and softplus, f32 and f64 alike. Checked here: the mask
and the gradient end to end (compiled by the cpu codegen, no group on eager), and the
mechanism itself (a SIMD loop and a scalar loop of one library agree bit for bit on every
argument kind)."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import codegens, compiled, group_text
from torchloom.api import parse_graph
from torchloom_codegen_cpu import libmvec
from torchloom_codegen_cpu.prelude import prelude
from torchloom_codegen_cpu.toolchain import build

FUNCTIONS = {"sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "erf": torch.erf,
             "log": lambda x: torch.log(x.abs() + 0.1), "log1p": lambda x: torch.log1p(x.abs()),
             "expm1": torch.expm1, "softplus": F.softplus,
             # sin and cos of one value in one loop (gcc would merge builtins into sincos)
             "sincos": lambda x: torch.sin(x) * torch.cos(x),
             "pow": lambda x: x.abs() ** 1.7, "atan2": lambda x: torch.atan2(x, x - 0.5)}
DTYPES = {"f32": torch.float32, "f64": torch.float64}


def _column_maxima(g):
    def f(x, y):
        h = g(x) + y
        return (h == h.amax(0, keepdim=True)).sum(0)
    return f


def _amax_sum(g):
    return lambda x, y: (g(x) + y).amax(0).sum()


def _inputs(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=dtype) * 3,
            torch.randn(shape, generator=gen, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_column_has_its_maximum(tmp_path, name, dtype):
    compiler, fn = compiled(_column_maxima(FUNCTIONS[name]), tmp_path, dynamic=True)
    for k, shape in enumerate([(2, 19), (3, 37), (5, 100), (2, 1000)]):
        x, y = _inputs(shape, DTYPES[dtype], k)
        count = fn(x, y)
        assert (count >= 1).all(), (shape, (count == 0).sum())
        assert torch.equal(count, _column_maxima(FUNCTIONS[name])(x, y))
    assert codegens(compiler) and set(codegens(compiler)) == {"cpu"}, codegens(compiler)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_amax_gradient_of_a_recomputed_value(tmp_path, name, dtype):
    g = FUNCTIONS[name]
    compiler, fn = compiled(_amax_sum(g), tmp_path, dynamic=True)
    for k, shape in enumerate([(2, 19), (3, 37), (4, 50)]):
        x, y = _inputs(shape, DTYPES[dtype], k)
        x.requires_grad_()
        fn(x, y).backward()
        got, x.grad = x.grad, None
        _amax_sum(g)(x, y).backward()
        assert not got.isnan().any(), (shape, got)
        torch.testing.assert_close(got, x.grad, rtol=1e-5, atol=1e-5)
    assert set(codegens(compiler)) == {"cpu"}, codegens(compiler)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 6), cols=st.integers(1, 300), seed=st.integers(0, 2 ** 16),
       name=st.sampled_from(["sin", "log1p", "erf"]), dtype=st.sampled_from(list(DTYPES)))
def test_column_maxima_at_any_shape(tmp_path_factory, rows, cols, seed, name, dtype):
    """Shapes of any row and column count (odd tails, one row, one column). Each example
    compiles again, at ``dynamic=True``: the C source of a function and dtype is the same at
    every size, so its library is built once and shared."""
    _, fn = compiled(_column_maxima(FUNCTIONS[name]), tmp_path_factory.mktemp("c"),
                     dynamic=True)
    x, y = _inputs((rows, cols), DTYPES[dtype], seed)
    assert torch.equal(fn(x, y), _column_maxima(FUNCTIONS[name])(x, y))


_LOOPS = """
void v_{fn}(const {t}* x, const {t}* z, {t}* y, long n) {{
#pragma omp simd
  for (long i = 0; i < n; i++) y[i] = {call}({args});
}}
__attribute__((optimize("no-tree-vectorize")))
void s_{fn}(const {t}* x, const {t}* z, {t}* y, long n) {{
  for (long i = 0; i < n; i++) y[i] = {call}({args});
}}
"""
#: the functions of two arguments (the second from ``z``)
BINARY = ("pow", "atan2", "hypot")


@pytest.fixture(scope="module")
def loops(tmp_path_factory, codegen):
    """A library of one SIMD loop and one scalar loop of each function, f32 and f64."""
    text = prelude() + "".join(
        _LOOPS.format(fn=f"{fn}_{t}", t=t, call=fn + ("f" if t == "float" else ""),
                      args="x[i], z[i]" if fn in BINARY else "x[i]")
        for fn in libmvec.VECTOR_MATH for t in ("float", "double"))
    tc = codegen.toolchain()
    return ctypes.CDLL(str(build(text, tc, tmp_path_factory.mktemp("libm"), codegen.timeout)))


def _arguments(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    info = np.finfo(dtype)
    parts = [rng.standard_normal(4000) * 10, rng.standard_normal(1000) * 1e4,
             rng.uniform(-1, 1, 1000), rng.uniform(0, 1e-3, 500),
             [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny,
              info.tiny / 4, 1e30, -1e30, 88.7, 89.0, 709.0, 710.0, -103.0, -745.0]]
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fn", libmvec.VECTOR_MATH)
def test_a_simd_loop_and_a_scalar_loop_agree(loops, fn, dtype):
    """Bit for bit, at every offset (a 16-lane body, an 8-lane tail, a scalar tail)."""
    t = "float" if dtype == np.float32 else "double"
    x = _arguments(dtype)
    if fn in ("log", "log2", "log10"):
        x = np.abs(x)
    if fn == "log1p":
        x = np.abs(x) - 0.5
    z = np.roll(x, 1) if fn != "pow" else np.tile(
        np.asarray([2.0, 0.5, -1.5, 3.0, 0.0, -0.0, np.inf, np.nan, 1e-3, 17.25, -7.0],
                   dtype=dtype), x.size // 11 + 1)[:x.size]
    n = x.size
    vector, scalar = np.empty_like(x), np.empty_like(x)
    pointer = ctypes.c_void_p
    for offset in (0, 1, 7):  # (the SIMD loop's body and tails move with it)
        args = (pointer(x[offset:].ctypes.data), pointer(z[offset:].ctypes.data))
        getattr(loops, f"v_{fn}_{t}")(*args, pointer(vector.ctypes.data),
                                       ctypes.c_long(n - offset))
        getattr(loops, f"s_{fn}_{t}")(*args, pointer(scalar.ctypes.data),
                                       ctypes.c_long(n - offset))
        v, s = vector[:n - offset], scalar[:n - offset]
        assert np.array_equal(v.view(np.uint64 if t == "double" else np.uint32)[~np.isnan(v)],
                              s.view(np.uint64 if t == "double" else np.uint32)[~np.isnan(v)])
        assert np.array_equal(np.isnan(v), np.isnan(s))
        wide = [torch.from_numpy(a[offset:].astype(np.float64))
                for a in ((x, z) if fn in BINARY else (x,))]
        want = getattr(torch, fn)(*wide)
        torch.testing.assert_close(torch.from_numpy(v), want.to(torch.from_numpy(v).dtype),
                                   rtol=5e-7 if t == "float" else 1e-14, atol=1e-30,  # 4 ulp
                                   equal_nan=True)


#: every op whose template calls a libm function with libmvec variants, and its inputs
LIBM_OPS = {**{op: 1 for op in (
    "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "erf", "erfc", "sinc",
    "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan", "elu", "selu", "celu",
    "softplus", "mish", "special_entr", "logit")},
    "logaddexp": 2, "xlogy.Tensor": 2, "special_xlog1py": 2, "atan2": 2, "hypot": 2,
    "pow.Tensor_Tensor": 2}


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_every_libm_op_is_vectorized(registry, codegen, tmp_path, dtype):
    """Each such op's loop calls the vector clone (``tl_m_``'s, libmvec.py), those with a
    branch too: gcc 12 if-converts no call it does not know (softplus's loop, its libm
    calls under other names, was scalar: 20 times slower)."""
    if not codegen.toolchain().vector_math or "clang" in codegen.toolchain().version:
        pytest.skip("gcc with libmvec only")  # (glibc on x86-64 has it)
    n, kernels = 4099, {}
    for op, arity in LIBM_OPS.items():
        name = op if "." in op else f"{op}.default"
        args = ", ".join(f"%a{k}" for k in range(arity))
        text = group_text(", ".join(f"%a{k}: {dtype}[{n}]" for k in range(arity)),
                          f"%o = aten.{name}({args}) : {dtype}[{n}]", f"%o: {dtype}[{n}]")
        node = next(parse_graph(text).nodes)
        assert codegen.supports(node, registry) is None, op
        kernels[op] = codegen.generate(node, registry)
    launchers = codegen.load_many(list(kernels.values()), registry)
    assert len(launchers) == len(kernels)
    head = prelude()
    path = build(codegen.translation_unit(list(kernels.values())), codegen.toolchain(),
                 codegen.cache_dir, codegen.timeout)
    code = subprocess.run(["objdump", "-d", str(path)], capture_output=True, text=True).stdout
    bodies = dict(_functions(code))
    for op, kernel in kernels.items():
        assert kernel.source.startswith(head)
        body = "".join(b for f, b in bodies.items() if f.startswith(kernel.metadata["kernel"]))
        assert body, (op, sorted(bodies)[:20])
        assert "v_tl_m_" in body, op


def _functions(disassembly: str):
    """(name, text) of each function objdump lists."""
    name, lines = None, []
    for line in disassembly.splitlines():
        if line.endswith(">:"):
            if name is not None:
                yield name, "\n".join(lines)
            name, lines = line.split("<", 1)[1][:-2], []
        elif name is not None:
            lines.append(line)
    if name is not None:
        yield name, "\n".join(lines)


SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, 1.5, 7.0, 0.3, float("inf"),
            float("-inf"), float("nan"), 1e-40, -1e-40, 3e38, -3e38, 1e-300, 89.0, 710.0,
            -710.0, 1.0000001, 0.9999999, 27.0, 1e-8]
UNARY = ["erfc", "sinh", "cosh", "asinh", "acosh", "atanh", "asin", "acos", "atan", "sin",
         "cos", "tan", "tanh", "erf", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p"]
SPECIAL_TOLERANCE = {torch.float32: 2e-6, torch.float64: 1e-13, torch.bfloat16: 1e-2}


def _as_eager(got, want, dtype) -> None:
    """Within the tolerance, NaN where eager's is NaN, and a zero's sign as eager's."""
    close = torch.isclose(got.double(), want.double(), rtol=SPECIAL_TOLERANCE[dtype], atol=0,
                          equal_nan=True)
    sign = (want != 0) | (torch.signbit(got) == torch.signbit(want))
    assert (close & sign).all(), [(k, got.flatten()[k], want.flatten()[k])
                                  for k in torch.nonzero(~(close & sign).flatten())[:8]]


@pytest.mark.parametrize("dtype", list(SPECIAL_TOLERANCE))
def test_special_values_of_every_function(tmp_path, dtype):
    """Zeros of both signs, infinities, NaN, subnormals, domain edges (1, -1) and overflow:
    the variants' special cases (their scalar callouts) give eager's values."""
    x = torch.tensor(SPECIALS, dtype=torch.float64).to(dtype)

    def f(x):
        return torch.stack([getattr(torch, name)(x) for name in UNARY])
    compiler, fn = compiled(f, tmp_path)
    _as_eager(fn(x), f(x), dtype)
    assert set(codegens(compiler)) == {"cpu"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_values_of_two_arguments(tmp_path, dtype):
    """pow (pow(1, NaN) = 1, pow(NaN, 0) = 1, pow(-0, -3) = -inf, ...), atan2 (the signs of
    zeros) and hypot (hypot(inf, NaN) = inf) on every pair of special values."""
    grid = torch.tensor(SPECIALS, dtype=dtype)
    x, y = grid.repeat_interleave(len(SPECIALS)), grid.repeat(len(SPECIALS))

    def f(x, y):
        return torch.stack([torch.pow(x, y), torch.atan2(x, y), torch.hypot(x, y)])
    compiler, fn = compiled(f, tmp_path)
    _as_eager(fn(x, y), f(x, y), dtype)
    assert set(codegens(compiler)) == {"cpu"}
