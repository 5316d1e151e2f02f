"""The cpu codegen reads the core's kernel schedule (issue 42): its kernels report the
schedule's form, and it declines through the capabilities it declares."""

from __future__ import annotations

import pytest
from torchloom.api import FORMS, Schedule, parse_graph
from torchloom.testing import pointwise, reductions

from torchloom_codegen_cpu.codegen import CAPABILITIES
from torchloom_codegen_cpu.function import write_function

CASES = {**reductions.CASES, **pointwise.CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_kernel_reports_its_schedules_form(registry, name):
    group = next(parse_graph(CASES[name][0]).nodes)
    assert CAPABILITIES.declines(group) is None
    _, metadata = write_function(group, registry)
    assert metadata["schedule"] == Schedule.of(group).form


def test_it_declares_every_form_and_its_tables():
    assert CAPABILITIES.forms == frozenset(FORMS) and CAPABILITIES.symbolic
    assert {"aten.exp.default", "aten.amax.default"} <= CAPABILITIES.ops
    assert {"sum", "var", "argmax", "any"} <= CAPABILITIES.kinds
