"""The pass manager inside the compiler: under torch.compile a failing pass never breaks
the user's model (the graph runs eagerly, the reason and reproducer are recorded), and
``on_error = "skip"`` says so once for all the graphs of one compiler."""

from __future__ import annotations

import logging

import torch

from torchloom.compiler import Compiler
from torchloom.backend import torchloom_backend

from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)


def fn(x, y):
    return (x + y).exp() * y


def compile_with(compiler):
    torch._dynamo.reset()
    return torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))


def write_pipeline(tmp_path, on_error: str) -> str:
    path = tmp_path / f"{on_error}.toml"
    path.write_text(f'[pipeline]\nname = "{on_error}"\ncodegen = "eager"\non_error = '
                    f'"{on_error}"\n\n[[pass]]\nname = "cse"\n\n[[pass]]\nname = "fake.boom"\n')
    return str(path)


def test_a_failing_pass_runs_the_graph_eagerly_and_records_why(fake_plugins, tmp_path):
    compiler = Compiler(write_pipeline(tmp_path, "raise"), plugins=fake_plugins,
                        cache_dir=tmp_path / "cache")
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(compile_with(compiler)(x, y), fn(x, y))
    torch._dynamo.reset()
    [comp] = compiler.compilations
    assert comp.fallback_reason.startswith("pass 'fake.boom' (distribution fake-passes 1.2.3) "
                                           "raised: RuntimeError: boom")
    [repro] = (tmp_path / "cache" / "reproducers").iterdir()
    assert f"Reproducer: {repro}" in comp.fallback_reason
    assert (repro / "before.ir").read_text().startswith("graph @graph0(")


def test_skip_says_so_once_for_forward_and_backward(fake_plugins, tmp_path, caplog):
    compiler = Compiler(write_pipeline(tmp_path, "skip"), plugins=fake_plugins,
                        cache_dir=tmp_path / "cache")
    x = torch.randn(4, 8, requires_grad=True)
    y = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="torchloom.passes"):
        out = compile_with(compiler)(x, y)
        out.sum().backward()
    torch._dynamo.reset()
    x_ref = x.detach().clone().requires_grad_()
    fn(x_ref, y).sum().backward()
    torch.testing.assert_close(out, fn(x_ref, y))
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert len(compiler.compilations) == 2  # forward and backward
    for comp in compiler.compilations:
        assert comp.fallback_reason is None
        assert [r.name for r in comp.report.records if r.skipped] == ["fake.boom"]
        assert any(n.startswith("pass 'fake.boom' skipped after it failed") for n in comp.notes)
    logged = [r for r in caplog.records if "fake.boom" in r.getMessage()]
    assert len(logged) == 1
