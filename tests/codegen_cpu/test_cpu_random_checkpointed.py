"""Random programs trained under activation checkpointing with dropout: each floating
output of a random program (:mod:`torchloom.testing.torch_programs`) goes through a
dropout inside one non-reentrant checkpoint, so the partitioner recomputes the program
and its dropouts in the backward (the cpu dropout library's wrapped forms, and the masks
``frontend.checkpointed_dropout`` draws from shapes). Against eager from the same seed:
the generator's state afterwards exactly, non-finite gradients where eager has them, and
the gradients within 3x eager's own error against float64 (which draws the same masks:
the stream does not depend on the dtype). 8 programs; ``--fuzz`` runs 1,000."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint
from torchloom.testing.torch_programs import TorchProgram, draw_program

from test_cpu_random_programs import _gradients, hypothesis_draw


def _checkpointed(f):
    def layer(*xs):
        return tuple(F.dropout(o, 0.3, True) if o.is_floating_point() else o for o in f(*xs))

    def g(*xs):
        return checkpoint(layer, *xs, use_reentrant=False)
    return g


def _seeded(fn, inputs, dtype=None):
    torch.manual_seed(11)
    grads = _gradients(fn, inputs, dtype)
    return grads, torch.get_rng_state()


def _check_checkpointed(program: TorchProgram) -> None:
    f = _checkpointed(program.function())
    inputs = program.example_inputs()
    try:
        exact, _ = _seeded(f, inputs, torch.float64)
        eager, state = _seeded(f, inputs)
    except RuntimeError:  # eager refuses the program, or its backward
        return
    torch._dynamo.reset()
    got, got_state = _seeded(torch.compile(f, backend="torchloom"), inputs)
    assert torch.equal(got_state, state), f"the generator's state after\n{program}"
    for k, (g, e, want) in enumerate(zip(got, eager, exact)):
        where = f"gradient {k} of\n{program}"
        finite = torch.isfinite(e)
        assert torch.equal(finite, torch.isfinite(g)), where
        both = finite & torch.isfinite(want)
        if not both.any():
            continue
        want64, scale = want[both], want[both].abs().max().item()
        own = (e[both].double() - want64).abs().max().item()
        error = (g[both].double() - want64).abs().max().item()
        assert error <= 3 * own + 1e-5 * max(scale, 1.0), (where, error, own, scale)


@pytest.mark.slow
def test_checkpointed_random_programs_with_dropout(fuzz):
    @settings(max_examples=1_000 if fuzz else 8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def run(data):
        _check_checkpointed(draw_program(hypothesis_draw(data.draw)))
    run()
