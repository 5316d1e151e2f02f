"""addcdiv and addcmul put back where Dynamo wrote them out (torchloom.frontend.addc_ops): a
compiled ``torch.addcdiv(..., value=v)``, ``Tensor.addcdiv_`` and ``Tensor.addcmul_``
(Adam's update without foreach) give eager's values bit for bit in f32, bf16 and f16, and
ops a program writes itself are left as written."""

from __future__ import annotations

import pytest
import torch

from torchloom.frontend.addc_ops import restore_addc_ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x, a = (torch.randn(shape, generator=g).to(dtype) * 3 for _ in range(2))
    b = (torch.rand(shape, generator=g) + 0.05).to(dtype) * torch.where(
        torch.rand(shape, generator=g) < 0.3, -1.0, 1.0).to(dtype)
    return x, a, b


def functional(x, a, b):
    return torch.addcdiv(x, a, b, value=3.14) * 2


def in_place(x, a, b):
    y = x.clone()
    y.addcdiv_(a, b, value=-0.001)  # (an Adam step: param.addcdiv_(m, denom, value=-lr))
    return y


def negative_int(x, a, b):
    return x.addcdiv(a, b[0], value=-2)  # (the method, a broadcast divisor)


def second_moment(x, a, b):
    y = x.abs()
    y.mul_(0.999).addcmul_(a, a, value=0.001)  # (Adam: exp_avg_sq, its gradient squared)
    return y


def products(x, a, b):
    y = x.clone()
    y.addcmul_(a, b, value=-3)
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [functional, in_place, negative_int, second_moment, products])
@pytest.mark.parametrize("shape", [(1000,), (7, 33), (2, 3, 5)])
def test_addcdiv_compiled_is_eager_bit_for_bit(fn, dtype, shape):
    torch._dynamo.reset()
    args = _inputs(shape, dtype, seed=len(shape))
    got = torch.compile(fn, backend="torchloom")(*args)
    want = fn(*args)
    assert got.dtype == want.dtype and torch.equal(got, want)


def _dynamo_graph(fn, *args) -> torch.fx.GraphModule:
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm
    torch._dynamo.reset()
    torch.compile(fn, backend=capture)(*args)
    (gm,) = graphs
    return gm


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


@pytest.mark.parametrize(("fn", "op", "written"), [(functional, torch.addcdiv, torch.div),
                                                   (in_place, torch.addcdiv, torch.div),
                                                   (products, torch.addcmul, torch.mul)])
def test_dynamos_writing_out_becomes_the_op_again(fn, op, written):
    gm = _dynamo_graph(fn, *_inputs((4,), torch.float32, 0))
    assert op not in _targets(gm)  # (Dynamo wrote it out)
    assert restore_addc_ops(gm) == 1
    assert op in _targets(gm) and written not in _targets(gm)
    args = _inputs((4,), torch.float32, 1)
    assert torch.equal(gm(*args)[0], fn(*args))


def test_operators_a_program_writes_are_left_as_written():
    def written(x, a, b):
        return x + a / b * 3.14  # eager rounds a / b, then the product: so must we

    def tensor_value(x, a, b):
        return torch.addcdiv(x, a, b, value=torch.tensor(0.5))  # (not a Python number)

    def product_read_twice(x, a, b):
        p = torch.mul(a, b)
        return torch.add(x, torch.mul(p, 2.0)), p

    for fn in (written, tensor_value, product_read_twice):
        gm = _dynamo_graph(fn, *_inputs((4,), torch.float32, 0))
        assert restore_addc_ops(gm) == 0
    for dtype in DTYPES:
        torch._dynamo.reset()
        args = _inputs((300,), dtype, 2)
        assert torch.equal(torch.compile(written, backend="torchloom")(*args), written(*args))
