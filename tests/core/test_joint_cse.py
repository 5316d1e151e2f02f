"""CSE of the joint forward/backward graph before the min-cut split
(``torchloom.frontend.joint_cse``, run by ``backend.cse_then_min_cut`` in place of the
partitioner's own ``fx_graph_cse``, which imports Inductor's lowerings)."""

from __future__ import annotations

import collections
import copy
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._functorch.compile_utils import fx_graph_cse
from torch.fx.experimental.proxy_tensor import make_fx

from torchloom.frontend.joint_cse import joint_cse

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class MLPBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = (torch.nn.LayerNorm(16), torch.nn.Linear(16, 32),
                                         torch.nn.Linear(32, 16))

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v


class TwinOutputs(torch.nn.Module):
    """Returns the same computation twice: eager gives two tensors, so must the graph."""

    def forward(self, x):
        return torch.tanh(x) * 2, torch.tanh(x) * 2


def models():
    torch.manual_seed(0)
    rms = torch.nn.RMSNorm(16)
    return {
        "mlp_block": (MLPBlock(), (4, 16)),
        "attention": (Attention(), (2, 5, 16)),
        "rms_norm_silu": (torch.nn.Sequential(rms, torch.nn.SiLU(), torch.nn.Linear(16, 8)),
                          (6, 16)),
        "batch_norm_train": (torch.nn.Sequential(torch.nn.Linear(16, 8),
                                                 torch.nn.BatchNorm1d(8), torch.nn.ReLU()),
                             (6, 16)),
        "dropout_train": (torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.3),
                                              torch.nn.Linear(16, 16), torch.nn.Dropout(0.3)),
                          (4, 16)),
        "lstm_cell": (torch.nn.LSTMCell(16, 16), (3, 16)),
        "twin_outputs": (TwinOutputs(), (5, 7)),
    }


def joint_graphs(model, shape):
    """The joint graphs aot_autograd hands the partitioner for one training step, with the
    norms decomposed as the backend asks."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    from torchloom.backend import split_options
    graphs = []

    def record(joint_module, joint_inputs, **kwargs):
        graphs.append(joint_module.graph)
        return default_partition(joint_module, joint_inputs, **kwargs)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           partition_fn=record,
                           decompositions=split_options("min_cut", {})["decompositions"])
    out = torch.compile(model, backend=backend)(torch.randn(*shape, requires_grad=True))
    sum(o.sum() for o in (out if isinstance(out, tuple) else (out,))).backward()
    assert graphs
    return graphs


def calls(graph) -> collections.Counter:
    return collections.Counter(str(n.target) for n in graph.nodes if n.op == "call_function")


@pytest.mark.parametrize("name", list(models()))
def test_merges_what_torchs_own_cse_merges_on_joint_graphs(name):
    model, shape = models()[name]
    for graph in joint_graphs(model, shape):
        ours, theirs = joint_cse(graph), fx_graph_cse(graph)
        assert calls(ours) == calls(theirs), name
        ours.lint()
        assert len(list(ours.nodes)) <= len(list(graph.nodes))


def test_a_layer_norm_backward_reuses_the_forwards_values():
    graph = joint_graphs(MLPBlock(), (4, 16))[0]
    before, after = calls(graph), calls(joint_cse(graph))
    merged = sum((before - after).values())
    assert merged > 0, before
    assert sum(after.values()) == sum(before.values()) - merged


def traced(fn, *shapes):
    return make_fx(fn, tracing_mode="fake")(*[torch.randn(*s) for s in shapes]).graph


def count(graph, target) -> int:
    return sum(1 for n in graph.nodes if n.target is target)


def test_equal_calls_merge_and_their_users_follow():
    def f(x):
        a, b = aten.mul.Tensor(x, 2), aten.mul.Tensor(x, 2)
        return aten.add.Tensor(aten.exp.default(a), aten.exp.default(b))
    graph = joint_cse(traced(f, (3,)))
    assert count(graph, aten.mul.Tensor) == 1 and count(graph, aten.exp.default) == 1
    add = next(n for n in graph.nodes if n.target is aten.add.Tensor)
    assert add.args[0] is add.args[1]


@pytest.mark.parametrize("first, second", [(0.0, -0.0), (1, 1.0), (True, 1), (2.0, 2.5)])
def test_arguments_equal_as_python_values_but_not_as_arguments_do_not_merge(first, second):
    def f(x):
        return aten.mul.Tensor(x, first), aten.mul.Tensor(x, second)
    assert count(joint_cse(traced(f, (3,))), aten.mul.Tensor) == 2


def test_random_and_uninitialised_values_never_merge():
    def f(x):
        return (aten.rand_like.default(x), aten.rand_like.default(x),
                aten.empty_like.default(x), aten.empty_like.default(x),
                aten.bernoulli.p(x, 0.5), aten.bernoulli.p(x, 0.5))
    graph = joint_cse(traced(f, (4,)))
    for op in (aten.rand_like.default, aten.empty_like.default, aten.bernoulli.p):
        assert count(graph, op) == 2, op


def test_a_mutation_between_equal_calls_keeps_both():
    def f(x, y):
        a = aten.mul.Tensor(y, 3)
        aten.add_.Tensor(y, x)  # y changes: the second mul reads another value
        b = aten.mul.Tensor(y, 3)
        c = aten.mul.Tensor(y, 3)  # same region as b: merged with it
        return aten.add.Tensor(aten.add.Tensor(a, b), c)
    graph = joint_cse(traced(f, (4,), (4,)))
    assert count(graph, aten.mul.Tensor) == 2
    assert count(graph, aten.add_.Tensor) == 1


def side_effect(t):
    return t


def test_unknown_python_calls_end_a_region_and_are_kept():
    graph = traced(lambda x: (aten.neg.default(x), aten.neg.default(x)), (2,))
    first = next(n for n in graph.nodes if n.target is aten.neg.default)
    with graph.inserting_after(first):
        graph.call_function(side_effect, (first,))
    cse = joint_cse(graph)
    assert count(cse, aten.neg.default) == 2
    assert count(cse, side_effect) == 1


def test_values_returned_as_separate_outputs_stay_separate():
    graph = traced(lambda x: (aten.tanh.default(x), aten.tanh.default(x)), (5,))
    cse = joint_cse(graph)
    assert count(cse, aten.tanh.default) == 2
    output = next(n for n in cse.nodes if n.op == "output")
    first, second = output.args[0]
    assert first is not second


def test_signed_zero_constants_train_as_eager():
    def f(x):
        return x * 0.0 + torch.exp(x * -0.0), (x * -0.0) * 3
    x = torch.tensor([-1.0, 0.0, -0.0, 2.0])
    want = f(x)
    got = torch.compile(f, backend="torchloom")(x.clone().requires_grad_())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.detach(), w, rtol=0, atol=0)
        assert torch.equal(torch.signbit(g.detach()), torch.signbit(w))


def test_batch_norm_training_updates_running_stats_and_grads_as_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.BatchNorm1d(6),
                                torch.nn.GELU(), torch.nn.Linear(6, 4))
    twin = copy.deepcopy(model)
    x = torch.randn(10, 8)
    compiled = torch.compile(twin, backend="torchloom")
    for _ in range(2):
        model(x).square().sum().backward()
        compiled(x).square().sum().backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
    torch.testing.assert_close(twin[1].running_mean, model[1].running_mean)
    torch.testing.assert_close(twin[1].running_var, model[1].running_var)


@pytest.mark.slow
def test_a_training_step_does_not_import_inductors_lowerings():
    """The reason for the pass: torch's own joint-graph CSE imports
    torch._inductor.pattern_matcher (and its lowerings), 0.57 s of a fresh process."""
    code = textwrap.dedent("""
        import sys, torch
        model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.GELU())
        x = torch.randn(4, 8, requires_grad=True)
        torch.compile(model, backend="torchloom")(x).sum().backward()
        assert x.grad is not None
        print(sorted(m for m in ("torch._inductor.pattern_matcher", "torch._inductor.lowering")
                     if m in sys.modules))
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip().splitlines()[-1] == "[]"
