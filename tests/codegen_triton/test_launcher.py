"""The launcher (codegen.Launcher): what does not change per call is computed once, the
compiled kernel's own launcher is reused per specialisation of the scalar arguments (so
groups with scalars are not always on the slow JIT path), unexpected strides are fixed.
A recording stand-in for the Triton kernel object lets this run without a GPU."""

from __future__ import annotations

import torch

from torchloom_codegen_triton.codegen import Launcher

META = {"kernel": "k", "device": "cpu", "grid_size": 100, "outputs": [
    {"shape": [10, 10], "strides": [10, 1], "dtype": "f32"}], "inputs": [
    {"shape": [10, 10], "strides": [10, 1], "dtype": "f32"}, {"scalar": "int"}],
    "configs": [{"XBLOCK": 32, "num_warps": 4}]}


class Recording:
    """``fn[grid](*args, **kwargs)`` as Triton's JIT function and compiled kernel take it."""

    def __init__(self, log, label):
        self.log, self.label = log, label

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.label == "fast":  # Triton's compiled kernel reads a grid of three dims
                grid[0], grid[1], grid[2]
            self.log.append((self.label, grid, args, kwargs))
            return Recording(self.log, "fast")
        return launch


def launcher():
    log = []
    return Launcher(Recording(log, "jit"), META, dict(META["configs"][0]), None, False), log


def test_scalar_groups_reuse_the_compiled_launcher_per_specialisation():
    run, log = launcher()
    x = torch.randn(10, 10)
    for scalar in (5, 7, 1, 3, 1, 32, 48):
        run(x, scalar)
    # 5, 7 and 3 share one specialisation; 1 and 32/48 have their own: three JIT launches
    assert [entry[0] for entry in log] == ["jit", "fast", "jit", "fast", "fast", "jit", "fast"]
    # ceil(100 / 32), computed once per config; three dims for the compiled kernel
    assert {(entry[0], entry[1]) for entry in log} == {("jit", (4,)), ("fast", (4, 1, 1))}
    assert [k for k in run._plans] == [id(run.config)]


def test_unexpected_strides_are_fixed_before_the_launch():
    run, log = launcher()
    x = torch.randn(10, 10).t()  # the same shape, transposed strides
    (out,) = run(x, 2)
    passed = log[0][2][0]
    assert passed.stride() == (10, 1) and torch.equal(passed, x)
    assert out.shape == (10, 10) and out.stride() == (10, 1)
    y = torch.randn(10, 10)
    run(y, 2)
    assert log[1][2][0] is y  # the expected layout goes through as it is


def test_an_input_read_expanded_is_laid_out_so_when_handed_materialised():
    """An input the kernel reads at strides that let elements share memory (the graph
    expanded it: ``strided[0, 1]``), handed as a dense tensor of equal rows: laid out as
    the kernel reads it (copying into such strides raised before)."""
    meta = {**META, "inputs": [{"shape": [10, 10], "strides": [0, 1], "dtype": "f32"},
                               {"scalar": "int"}]}
    log = []
    run = Launcher(Recording(log, "jit"), meta, dict(meta["configs"][0]), None, False)
    x = torch.randn(1, 10).expand(10, 10).contiguous()
    run(x, 2)
    passed = log[0][2][0]
    assert passed.stride() == (0, 1) and torch.equal(passed, x)
