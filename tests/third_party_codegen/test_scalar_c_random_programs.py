"""Random torch programs (:mod:`torchloom.testing.torch_programs`: broadcasts, size-1 dims,
views, reductions kept and dropped, several outputs) compiled by a pipeline whose codegen
is the example's ``scalar_c`` (written against ``torchloom.api`` alone, so the core's
lowering writes every kernel), compared with eager: at static sizes, and every third
program with every size symbolic, then called again at other sizes. 24 programs;
``--fuzz`` runs 2,000."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torchloom.backend import torchloom_backend
from torchloom.testing.torch_programs import BASIC, WIDE, TorchProgram, draw_program, seeded

#: the first program's seed (seeds run from here up)
SEED = 14_100_000


def _resized(inputs: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """``inputs`` with every distinct size above 1 moved (the same one alike everywhere,
    so broadcasts stay broadcasts)."""
    sizes = sorted({d for x in inputs for d in x.shape if d >= 2})
    new = {d: [d + 1, 2, 2 * d + 1][(k + i) % 3] for i, d in enumerate(sizes)}
    g = torch.Generator().manual_seed(k)
    return [torch.randn([new.get(d, d) for d in x.shape], generator=g).to(x.dtype)
            for x in inputs]


def _assert_agrees(program: TorchProgram, compiled, f, inputs) -> bool:
    """Whether eager takes ``inputs`` (then the compiled function must agree with it)."""
    try:
        want = f(*[x.clone() for x in inputs])
    except RuntimeError:  # eager refuses the program (a shape it cannot take): so may we
        return False
    got = compiled(*[x.clone() for x in inputs])
    assert len(got) == len(want), program
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (str(program), k, g.shape, w.shape)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True,
                                   msg=lambda m, k=k: f"output {k} of\n{program}\n{m}")
    return True


def _check(compiler, seed: int) -> None:
    program = draw_program(seeded.from_seed(seed), ops=WIDE if seed % 2 else BASIC)
    f, inputs = program.function(), program.example_inputs()
    dynamic = seed % 3 == 0
    torch._dynamo.reset()
    compiled = torch.compile(f, dynamic=dynamic, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    if not _assert_agrees(program, compiled, f, inputs):
        return
    if dynamic and all(x.is_floating_point() for x in inputs):
        for k in range(2):
            _assert_agrees(program, compiled, f, _resized(inputs, k))


def _kernels(compiler) -> list[str]:
    return [c.codegen for comp in compiler.compilations for c in comp.compiled.choices]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
def test_random_programs_on_scalar_c_match_eager(plugins, scalar_c_compiler, fuzz):
    for seed in range(SEED, SEED + (2_000 if fuzz else 24)):
        _check(scalar_c_compiler, seed)
    torch._dynamo.reset()
    kernels = _kernels(scalar_c_compiler)
    # the programs' groups run on scalar_c (it declines few: an op outside its table)
    assert kernels.count("scalar_c") >= 0.7 * len(kernels) > 0, kernels
