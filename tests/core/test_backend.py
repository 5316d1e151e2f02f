"""The torch.compile backend: registration, options, and ops torchloom has never heard of."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from torchloom.compiler import Compiler


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@torch.library.custom_op("torchloom_tests::scaled_shift", mutates_args=())
def scaled_shift(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale + 1


@scaled_shift.register_fake
def _(x, scale):
    return torch.empty_like(x)


@pytest.mark.slow
def test_backend_entry_point_works_in_a_fresh_interpreter():
    code = textwrap.dedent("""
        import sys, torch
        f = lambda x: torch.sin(x) * 2
        x = torch.randn(5)
        out = torch.compile(f, backend="torchloom")(x)
        torch.testing.assert_close(out, f(x))
        print("compiled-by", "torchloom.compiler" in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "compiled-by True" in result.stdout


def test_unknown_backend_option_is_a_user_error_naming_it():
    f = torch.compile(lambda x: x + 1, backend="torchloom", options={"pipline": "none"})
    with pytest.raises(Exception, match="unknown option.s. 'pipline' .did you mean "
                                        "'pipeline'.*; known: pipeline"):
        f(torch.randn(2))


def test_pipeline_option_accepts_a_toml_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[pipeline]\nname = "mine"\ncodegen = "eager"\nverify = "each"\n\n'
                    '[[pass]]\nname = "dce"\n')
    compiler = Compiler(str(path))
    f = lambda x: (x.exp() + 1).relu()  # noqa: E731
    compiled = torch.compile(f, backend="torchloom", options={"compiler": compiler})
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), f(x))
    (comp,) = compiler.compilations
    assert comp.fallback_reason is None
    assert [r.name for r in comp.report.records] == ["dce"]


@pytest.mark.parametrize("pipeline", ["none", "default"])
def test_op_unknown_to_torchloom_is_opaque_and_runs(pipeline):
    compiler = Compiler(pipeline)

    def f(x):
        return torch.ops.torchloom_tests.scaled_shift(x.cos(), 3.0).sum(-1)

    compiled = torch.compile(f, backend="torchloom", options={"compiler": compiler})
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), f(x))
    (comp,) = compiler.compilations
    assert comp.fallback_reason is None
    ops = [n.op for n in comp.graph.walk()]
    assert "torchloom_tests.scaled_shift.default" in ops
    assert compiler.registry.category("torchloom_tests.scaled_shift.default") == "opaque"


@pytest.mark.parametrize("pipeline", ["none", "default"])
def test_higher_order_cond_runs_with_its_branches_as_constants(pipeline):
    compiler = Compiler(pipeline)

    def f(x):
        return torch.cond(x.sum() > 0, lambda y: y.sin(), lambda y: y.cos(), (x,)) * 2

    compiled = torch.compile(f, backend="torchloom", options={"compiler": compiler})
    for x in (torch.rand(4), -torch.rand(4)):  # both branches
        got = compiled(x)
        assert isinstance(got, torch.Tensor)  # a 1-element result sequence is not leaked
        torch.testing.assert_close(got, f(x))
    (comp,) = compiler.compilations
    assert comp.fallback_reason is None
    ops = [n.op for n in comp.graph.walk()]
    assert "higher_order.cond" in ops and "python.operator.getitem" in ops


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5), (0, 4)])
def test_efficient_zero_tensor_inputs_are_read_as_zeros(shape):
    # an efficient zero tensor has no memory (data pointer 0): a C kernel reading it
    # crashed the process; now such inputs are zeros for the compiled graph
    def f(x, y):
        return (x.exp() + y) * 2, (y * x).sum(-1)

    compiled = torch.compile(f, backend="torchloom", options={"pipeline": "default"})
    x = torch.randn(shape, requires_grad=True)
    z = torch._efficientzerotensor(shape)
    got, want = compiled(x, z), f(x, z)
    torch.testing.assert_close(got, want)
    sum(o.sum() for o in got).backward()
    grad, x.grad = x.grad, None
    sum(o.sum() for o in want).backward()
    torch.testing.assert_close(grad, x.grad)
    ones = torch.ones(shape)  # another graph (Dynamo guards the key): not zeros there
    torch.testing.assert_close(compiled(x, ones), f(x, ones))


@pytest.mark.parametrize("boxed", [False, True])
def test_materializing_zeros_keeps_the_calling_convention(boxed):
    from torchloom.backend import materializing_zeros
    seen = []

    def compiled(*args):
        seen.append([a._is_zerotensor() if isinstance(a, torch.Tensor) else a
                     for a in (args[0] if boxed else args)])
        return "done"

    z, x = torch._efficientzerotensor(2), torch.ones(2)
    wrapped = materializing_zeros(compiled, [x, z, 3], boxed=boxed)
    args = [x, z, 3]
    assert (wrapped(args) if boxed else wrapped(*args)) == "done"
    assert seen == [[False, False, 3]]
    assert args == [] if boxed else len(args) == 3  # a boxed call hands its list over
    assert materializing_zeros(compiled, [x, 3]) is compiled  # no zeros: as it was
