"""Golden test of one pass for pass authors' unit tests: IR text in, IR text out, and the
numbers the graph computes unchanged (used by tests/builtin and by third-party plugin tests)."""

from __future__ import annotations

import textwrap

from torchloom.ir.text import parse_graph


def golden(pass_, before: str, after: str, inputs: list, *, seed: int | None = None):
    """Golden test of one pass: IR text in, IR text out, and the numbers the graph computes
    unchanged (the graph before the pass, run op by op with torch, is the eager reference).

    Inputs are cloned for every run so that in-place ops see the same values; with
    ``seed``, the RNG is reseeded before each run. Returns the pass's PassResult.
    """
    import torch

    from torchloom.ir.verify import verify
    from torchloom.passes.base import PassContext
    from torchloom.ops.aten import default_registry
    from torchloom.runtime.executor import build_function

    registry = default_registry()  # the built-in ops: a unit test loads no plugin
    before, after = textwrap.dedent(before).lstrip(), textwrap.dedent(after).lstrip()

    def execute(graph):
        if seed is not None:
            torch.manual_seed(seed)
        args = [t.clone() for t in inputs]
        return list(build_function(graph, registry).fn(*args)) + args

    expected = execute(parse_graph(before))
    graph = parse_graph(before)
    result = pass_.run(graph, PassContext(registry=registry))
    verify(graph, registry)
    assert str(graph) == after
    assert result.changed == (before != after)
    torch.testing.assert_close(execute(graph), expected, equal_nan=True)
    return result
