"""Every op of PyTorch's OpInfo database through torch.compile(backend="torchloom").

test_opinfo_samples.py checks a curated list of ops in depth (several dtypes, backward, no
eager fallback allowed). This file is the breadth: each op of
``torch.testing._internal.common_methods_invocations.op_db`` on the CPU, its first sample
in f32 and in int64 (each the op takes; the first of three eager accepts),
forward, compiled by the default pipeline: whatever the pipeline does with it (a fused
kernel, a library call, a graph break), the values, shapes and dtypes are eager's and
nothing raises that eager does not. Ops whose values are random (eager's own output
differs call to call) or uninitialised, sparse layouts and CUDA-only ops are left out
(``UNCHECKABLE``).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing._internal import common_methods_invocations  # needs expecttest
from torch.utils._pytree import tree_leaves

pytestmark = pytest.mark.slow  # ~150 s on one core: ./dev test --fast leaves it out

#: op names (or name prefixes) whose results no comparison can check: random draws,
#: uninitialised memory, and outputs that are not values (storage, sparse layouts)
UNCHECKABLE = ("rand", "normal", "bernoulli", "nn.functional.dropout",
               "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
               "nn.functional.rrelu", "multinomial", "uniform", "poisson", "exponential",
               "geometric", "cauchy", "log_normal", "nn.functional.gumbel_softmax",
               "nn.functional.fractional_max_pool", "empty", "new_empty", "resize_",
               "resize_as_", "to_sparse", "sparse",
               "jiterator_")  # (CUDA's jiterator: eager rejects them on the CPU)
#: rtol, atol of floating results (integer and bool results are compared exactly)
TOLERANCE = (1e-4, 1e-5)


def _checkable(op) -> bool:
    return not any(op.name == u or op.name.startswith(u) for u in UNCHECKABLE)


def _name(op) -> str:
    return op.name + (f":{op.variant_test_name}" if op.variant_test_name else "")


#: (op, dtype) for each checkable op and each of f32, int64 it takes on the CPU
CASES = [(op, dtype) for op in common_methods_invocations.op_db if _checkable(op)
         for dtype in (torch.float32, torch.int64) if dtype in op.supported_dtypes("cpu")]


def _first_sample(op, dtype):
    """The op's first sample in ``dtype`` eager accepts and eager's result on it; None
    where eager rejects the first three."""
    for sample in itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), 3):
        try:
            return sample, op(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # an invalid combination eager rejects: the next sample
            continue
    return None


@pytest.fixture(autouse=True)
def no_test_function_lookup(monkeypatch):
    """OpInfo's ``sample_inputs`` looks for a unittest ``TestCase`` calling it with
    ``inspect.stack()`` (slow: the source of every frame); under pytest there is none
    (test_opinfo_samples.py's fixture, the same)."""
    from torch.testing._internal.opinfo import core
    monkeypatch.setattr(core, "extract_test_fn", lambda: None)


@pytest.mark.parametrize(("op", "dtype"), CASES,
                         ids=[f"{_name(op)}-{str(dtype)[6:]}" for op, dtype in CASES])
def test_compiled_op_matches_eager(op, dtype):
    found = _first_sample(op, dtype)
    if found is None:
        pytest.skip(f"eager rejects {_name(op)}'s first three {dtype} samples")
    sample, want = found

    def fn(inp, *args, **kwargs):
        return op(inp, *args, **kwargs)

    torch._dynamo.reset()
    got = torch.compile(fn, backend="torchloom")(sample.input, *sample.args, **sample.kwargs)
    got, want = ([t for t in tree_leaves(x) if isinstance(t, torch.Tensor)] for x in (got, want))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        exact = not (w.is_floating_point() or w.is_complex())
        rtol, atol = (0, 0) if exact else TOLERANCE
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
