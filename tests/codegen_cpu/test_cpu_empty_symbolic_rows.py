"""A max, min, argmax or argmin over rows of symbolic length that are empty at a call:
eager raises (``IndexError`` or ``RuntimeError`` by op and form), and the cpu kernel's
launcher raises the same error before calling the kernel, which would return its
accumulator's start (-inf for a max). At other sizes the one kernel matches eager."""

from __future__ import annotations

import pytest
import torch

from torchloom.api import parse_graph
from torchloom.runtime.executor import CompiledGraph
from torchloom.testing.reductions import EMPTY_ROWS
from torchloom.tools import EagerCodegen, load_plugins


@pytest.fixture(scope="module")
def plugins():
    return load_plugins()


@pytest.mark.parametrize("name", sorted(EMPTY_ROWS))
def test_empty_symbolic_rows_raise_as_eager(plugins, name):
    text, empty = EMPTY_ROWS[name]
    compiled = CompiledGraph(parse_graph(text), plugins.registry,
                             [plugins.codegen("cpu"), EagerCodegen()])
    assert [c.codegen for c in compiled.choices] == ["cpu"], compiled.choices
    eager = CompiledGraph(parse_graph(text), plugins.registry, [EagerCodegen()])
    a = torch.empty(empty)
    with pytest.raises((IndexError, RuntimeError)) as want:
        eager(a)
    with pytest.raises(want.type) as got:
        compiled(a)
    assert str(got.value) == str(want.value)
    for shape in [(3, 5), (1, 7), (6, 1)]:
        a = torch.randn(shape)
        for g, w in zip(compiled(a), eager(a)):
            torch.testing.assert_close(g, w)
