"""Random torch programs written as Python source, for differential tests end to end.

Where :mod:`torchloom.testing.programs` builds large aten programs over fixed shapes for
scaling tests, this module writes small programs as a user writes them: a few inputs of
random rank and size (size-1 dims on purpose: they are where stride and broadcast rules
meet), pointwise ops, broadcasts, strided slices, reshapes, transposes, expands,
reductions with and without kept dims, dead values, and several outputs::

    def f(x0, x1):
        v0 = x0[..., ::2]
        v1 = torch.tanh(v0)
        v2 = v0.reshape(v0.shape[0], -1)
        v3 = v1 * 0.5 + 1.0
        v4 = v2.amax(0, keepdim=False)
        return v3, v4

A program is drawn through a :class:`Draw` (``pick``, ``integer``, ``boolean``), so the
same generator serves a seeded :class:`random.Random` (:func:`seeded`, for a fuzzing
script) and hypothesis (an adapter over ``data.draw`` in the tests, which shrinks a failing
program to a small one; hypothesis is a test dependency, not the core's).
:meth:`TorchProgram.function` compiles the source into a function;
:meth:`TorchProgram.example_inputs` gives seeded inputs with edge values.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import torch

#: sizes a dim is drawn from: 1 (often), small odd and even sizes, one SIMD vector and more
SIZES = (1, 1, 1, 2, 3, 4, 5, 7, 8, 16, 17, 33)

#: unary ops as Python templates over ``{a}``; each keeps the shape
UNARY = ("torch.tanh({a})", "torch.sigmoid({a})", "torch.abs({a})", "-{a}", "torch.relu({a})",
         "torch.rsqrt(torch.abs({a}) + 1.0)", "torch.exp(-torch.abs({a}))", "{a} * 0.5 + 1.0",
         "torch.sin({a})", "({a} > 0).float()", "torch.clamp({a}, -0.5, 0.5)",
         "torch.nn.functional.gelu({a})", "torch.where({a} > 0, {a}, 0.1 * {a})")
#: binary ops over two broadcastable values
BINARY = ("{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})",
          "torch.minimum({a}, {b})", "{a} / (torch.abs({b}) + 1.0)")
#: reductions over one dim ``{d}`` keeping it or not (``{k}``)
REDUCTIONS = ("{a}.sum({d}, keepdim={k})", "{a}.amax({d}, keepdim={k})",
              "{a}.amin({d}, keepdim={k})", "{a}.mean({d}, keepdim={k})",
              "torch.softmax({a}, {d})", "torch.log_softmax({a}, {d})")
KINDS = ("unary", "unary", "binary", "binary", "view", "view", "reduce", "reduce", "scalar")


@attrs.frozen
class Ops:
    """The op templates a program is drawn from (``cat``: whether ``torch.cat`` of two
    values along a dim is a view kind too)."""

    unary: tuple[str, ...]
    binary: tuple[str, ...]
    reductions: tuple[str, ...]
    cat: bool = False


#: the ops above: the programs of the first tests (their draws are kept as they were)
BASIC = Ops(UNARY, BINARY, REDUCTIONS)
#: and more: casts through the narrow float types and integers, rounding, integer-valued
#: division and remainders, comparisons and logic as floats, special functions, variance,
#: products, log-sum-exp, arg reductions, cumulative sums, ``cat``
WIDE = Ops(
    UNARY + ("{a}.to(torch.bfloat16).float()", "{a}.to(torch.float16).float()",
             "{a}.double().exp().float()", "torch.floor({a})", "torch.round({a})",
             "torch.sign({a})", "torch.trunc({a} * 3.0)", "torch.erf({a})",
             "torch.log1p(torch.abs({a}))", "torch.expm1({a})", "torch.atan({a})",
             "torch.sqrt(torch.abs({a}))", "torch.pow({a}, 2)", "torch.pow({a}, 3)",
             "torch.pow(torch.abs({a}), 1.5)", "torch.reciprocal({a})",
             "torch.nan_to_num({a})", "torch.isnan({a}).float()",
             "torch.isinf({a}).float()", "torch.logical_not({a} > 0).float()",
             "torch.div({a}, 0.3, rounding_mode='floor')",
             "torch.div({a}, 0.3, rounding_mode='trunc')", "torch.remainder({a}, 0.7)",
             "torch.fmod({a}, 0.7)", "{a}.masked_fill({a} < 0, -1.5)",
             "torch.clamp_min({a}, 0.25)", "torch.nn.functional.silu({a})",
             "torch.nn.functional.softplus({a})", "torch.nn.functional.elu({a})",
             "torch.nn.functional.hardswish({a})", "torch.log(torch.abs({a}) + 1e-3)",
             # (clamped first: a float out of the integer's range converts to no defined value)
             "(({a} * 8).clamp(-99, 99).nan_to_num().to(torch.int32) // 3).float()",
             "(({a} * 8).clamp(-99, 99).nan_to_num().to(torch.int64) % 5).float()",
             "({a} * 4).clamp(-99, 99).nan_to_num().to(torch.int8).float()",
             "({a} != {a}).float()", "torch.erfinv(torch.tanh({a}) * 0.9)",
             "torch.lgamma(torch.abs({a}) + 0.5)"),
    BINARY + ("torch.where({a} > {b}, {a}, {b})", "torch.atan2({a}, {b})",
              "torch.remainder({a}, torch.abs({b}) + 0.5)",
              "torch.div({a}, torch.abs({b}) + 0.5, rounding_mode='floor')",
              "(({a} > 0) & ({b} > 0)).float()", "(({a} > 0) | ({b} < 0)).float()",
              "({a} == {b}).float()", "torch.copysign({a}, {b})", "torch.hypot({a}, {b})",
              "torch.pow(torch.abs({a}) + 0.5, {b})", "{a} * torch.sigmoid({b})",
              "torch.lerp({a}, {b}, 0.25)", "torch.fmax({a}, {b})",
              "torch.xlogy(torch.abs({a}), torch.abs({b}))"),
    REDUCTIONS + ("{a}.var({d}, keepdim={k})", "{a}.std({d}, keepdim={k}, correction=0)",
                  "{a}.prod({d}, keepdim={k})", "torch.logsumexp({a}, {d}, keepdim={k})",
                  "{a}.argmax({d}, keepdim={k}).float()",
                  "{a}.argmin({d}, keepdim={k}).float()",
                  "{a}.norm(dim={d}, keepdim={k})", "({a} > 0).any({d}, keepdim={k}).float()",
                  "({a} > 0).sum({d}, keepdim={k}).float()", "torch.cumsum({a}, {d})",
                  "{a}.max({d}, keepdim={k}).values", "torch.nansum({a}, {d}, keepdim={k})"),
    cat=True)


class Draw(Protocol):
    """Where a program's choices come from."""

    def pick(self, options: Sequence[Any]) -> Any: ...

    def integer(self, low: int, high: int) -> int: ...

    def boolean(self) -> bool: ...


@attrs.frozen
class seeded:
    """A :class:`Draw` from a seeded :class:`random.Random`."""

    rng: random.Random

    @classmethod
    def from_seed(cls, seed: int) -> seeded:
        return cls(random.Random(seed))

    def pick(self, options):
        return options[self.rng.randrange(len(options))]

    def integer(self, low, high):
        return self.rng.randint(low, high)

    def boolean(self):
        return self.rng.random() < 0.5


@attrs.frozen
class TorchProgram:
    """A program's source (``def f(x0, ...): ...``), its input shapes and the seed and
    edge values of its example inputs."""

    source: str
    shapes: tuple[tuple[int, ...], ...]
    seed: int = 0
    edges: bool = False

    def function(self) -> Callable[..., tuple]:
        scope: dict[str, Any] = {"torch": torch}
        exec(compile(self.source, "<random program>", "exec"), scope)  # noqa: S102 (our own text)
        return scope["f"]

    def example_inputs(self, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        inputs = [torch.randn(s, generator=gen).to(dtype) for s in self.shapes]
        if self.edges:  # NaN, inf, -inf and -0.0 at seeded places
            # (eager's own GELU of +inf is NaN in its vectorized loop and inf in its scalar
            # one, which it takes for one-element and strided tensors: no infinity where a
            # program has a GELU, which a negation would turn into +inf)
            big = 0.0 if "gelu" in self.source else float("inf")
            specials = torch.tensor([float("nan"), big, -big, -0.0])
            for k, x in enumerate(inputs):
                flat = x.view(-1)
                if flat.numel():
                    i = int(torch.randint(flat.numel(), (), generator=gen))
                    flat[i] = specials[(k + i) % 4].to(dtype)
        return inputs

    def __str__(self) -> str:
        return f"{self.source}# inputs: {list(map(list, self.shapes))}, seed {self.seed}, " \
               f"edge values {self.edges}\n"


@attrs.frozen
class _Value:
    name: str
    shape: tuple[int, ...]


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


def _shape(draw: Draw, rank: int) -> tuple[int, ...]:
    return tuple(draw.pick(SIZES) for _ in range(rank))


def _view(draw: Draw, a: _Value) -> tuple[str, tuple[int, ...]] | None:
    """A view of ``a`` (its text and shape), or None where the drawn view does not apply."""
    shape, n = a.shape, a.name
    rank = len(shape)
    kind = draw.pick(("step", "step", "narrow", "reshape", "flatten", "transpose", "unsqueeze",
                      "squeeze", "expand", "permute", "contiguous_t", "index"))
    if rank == 0:
        return None
    if kind == "step":
        d, step = draw.integer(0, rank - 1), draw.pick((2, 2, 3))
        idx = ", ".join([":"] * d + [f"::{step}"])
        new = list(shape)
        new[d] = -(-shape[d] // step)
        return (f"{n}[..., ::{step}]" if d == rank - 1 else f"{n}[{idx}]"), tuple(new)
    if kind == "narrow":
        d = draw.integer(0, rank - 1)
        start = draw.integer(0, shape[d] - 1) if shape[d] else 0
        length = draw.integer(0, shape[d] - start) if shape[d] else 0
        new = list(shape)
        new[d] = length
        return f"{n}.narrow({d}, {start}, {length})", tuple(new)
    if kind == "reshape" and rank >= 2:
        return f"{n}.reshape({n}.shape[0], -1)", (shape[0], _prod(shape[1:]))
    if kind == "flatten":
        return f"{n}.flatten()", (_prod(shape),)
    if kind == "transpose" and rank >= 2:
        new = list(shape)
        new[0], new[-1] = new[-1], new[0]
        return f"{n}.transpose(0, -1)", tuple(new)
    if kind == "unsqueeze":
        d = draw.integer(0, rank)
        return f"{n}.unsqueeze({d})", shape[:d] + (1,) + shape[d:]
    if kind == "squeeze" and 1 in shape:
        d = shape.index(1)
        return f"{n}.squeeze({d})", shape[:d] + shape[d + 1:]
    if kind == "expand" and 1 in shape:
        d = shape.index(1)
        new = list(shape)
        new[d] = draw.pick((2, 3, 8))
        return f"{n}.expand({', '.join(map(str, new))})", tuple(new)
    if kind == "permute" and rank >= 2:
        order = list(range(rank))[::-1]
        return f"{n}.permute({', '.join(map(str, order))})", tuple(shape[d] for d in order)
    if kind == "contiguous_t" and rank >= 2:
        return f"{n}.transpose(0, 1).contiguous()", (shape[1], shape[0], *shape[2:])
    if kind == "index" and rank >= 2 and shape[0] > 0:
        return f"{n}[{draw.integer(0, shape[0] - 1)}]", shape[1:]
    return None


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def draw_program(draw: Draw, *, max_inputs: int = 3, max_ops: int = 10,
                 ops: Ops = BASIC) -> TorchProgram:
    """One random program of ``ops``; see the module docstring."""
    rank = draw.integer(1, 3)
    base = _shape(draw, rank)
    inputs = [base]
    for _ in range(draw.integer(0, max_inputs - 1)):
        # broadcastable against the first: some of its dims set to 1, maybe fewer dims
        shape = tuple(1 if draw.boolean() else d for d in base)
        inputs.append(shape[draw.integer(0, len(shape) - 1):] if draw.boolean() else shape)
    values = [_Value(f"x{i}", s) for i, s in enumerate(inputs)]
    lines: list[str] = []
    for k in range(draw.integer(1, max_ops)):
        a = draw.pick(values)
        kind = draw.pick(KINDS)
        made: tuple[str, tuple[int, ...]] | None = None
        if kind == "unary":
            made = draw.pick(ops.unary).format(a=a.name), a.shape
        elif kind == "scalar":
            made = f"{a.name} * {draw.pick((0.5, -2.0, 3.0))}", a.shape
        elif kind == "binary":
            b = draw.pick(values)
            shape = _broadcast(a.shape, b.shape)
            if shape is not None:
                made = draw.pick(ops.binary).format(a=a.name, b=b.name), shape
        elif kind == "view":
            made = _cat(draw, a, values) if ops.cat and draw.integer(0, 3) == 0 else \
                _view(draw, a)
        elif a.shape:
            made = _reduction(draw, a, ops.reductions)
        if made is None:
            made = f"torch.tanh({a.name})", a.shape
        text, shape = made
        name = f"v{k}"
        lines.append(f"    {name} = {text}")
        values.append(_Value(name, tuple(shape)))
    made_values = values[len(inputs):]
    count = draw.integer(1, min(4, len(made_values)))
    outputs = [made_values[-1]] + [draw.pick(made_values) for _ in range(count - 1)]
    names = list(dict.fromkeys(v.name for v in outputs))
    params = ", ".join(f"x{i}" for i in range(len(inputs)))
    source = "\n".join([f"def f({params}):", *lines, f"    return {', '.join(names)},", ""])
    return TorchProgram(source, tuple(inputs), draw.integer(0, 2 ** 16), draw.boolean())


def _cat(draw: Draw, a: _Value, values: list[_Value]) -> tuple[str, tuple[int, ...]] | None:
    """``torch.cat`` of ``a`` and a value of its rank whose other dims match (``a`` itself
    where none does) along a drawn dim."""
    if not a.shape:
        return None
    d = draw.integer(0, len(a.shape) - 1)
    like = [v for v in values if len(v.shape) == len(a.shape) and all(
        x == y for i, (x, y) in enumerate(zip(v.shape, a.shape)) if i != d)]
    b = draw.pick(like)  # (a is among them)
    shape = list(a.shape)
    shape[d] += b.shape[d]
    return f"torch.cat([{a.name}, {b.name}], {d})", tuple(shape)


def _reduction(draw: Draw, a: _Value,
               templates: Sequence[str] = REDUCTIONS) -> tuple[str, tuple[int, ...]]:
    rank = len(a.shape)
    d = draw.integer(0, rank - 1)
    template = draw.pick(templates)
    keep = draw.boolean()
    if "softmax" in template or "cumsum" in template:
        return template.format(a=a.name, d=d, k=keep), a.shape
    if a.shape[d] == 0 and any(f in template for f in ("amax", "amin", "arg", ".max(")):
        template = REDUCTIONS[0]  # (eager raises for a max over no values)
    shape = tuple(1 if i == d else s for i, s in enumerate(a.shape)) if keep else \
        a.shape[:d] + a.shape[d + 1:]
    return template.format(a=a.name, d=d, k=keep), shape
