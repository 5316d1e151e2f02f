"""A generated Triton module defines the helpers (``ops.HELPERS``) its kernels call and no
others: the helpers are those the writer asked for (``Emitter.use``), so a plain GELU
kernel is its imports and one function, not forty lines of unrelated Welford and
arg-reduction combines."""

from __future__ import annotations

import ast

import pytest
from torchloom.api import parse_graph
from torchloom.testing.reductions import CASES

from conftest import group_text, on_device
from torchloom_codegen_triton import TritonCodegen
from torchloom_codegen_triton.ops import HELPERS

GELU = group_text("%x: f32[256, 96]", """
    %g = aten.gelu.default(%x) : f32[256, 96]""", "%g: f32[256, 96]")

#: groups whose kernels call every helper between them, in each form the writer has
GROUPS = {
    "gelu": (GELU, 4096),
    "maximum_minimum": (group_text("%a: f32[8, 16], %b: f32[8, 16]", """
        %m = aten.maximum.default(%a, %b) : f32[8, 16]
        %n = aten.minimum.default(%m, %b) : f32[8, 16]""", "%n: f32[8, 16]"), 4096),
    "bf16_casts": (group_text("%y: bf16[64, 96], %b: bf16[96]", """
        %a = aten.add.Tensor(%y, %b) : bf16[64, 96]
        %g = aten.mul.Tensor(%a, %a) : bf16[64, 96]""", "%g: bf16[64, 96]"), 4096),
    "split_sum": (group_text("%a: f32[4, 9000]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : f32[4]""", "%s: f32[4]"), 4096),
    "row_and_column_sums": (group_text("%a: f32[6, 8]", """
        %r = aten.sum.dim_IntList(%a) {dim = [1]} : f32[6]
        %c = aten.sum.dim_IntList(%a) {dim = [0]} : f32[8]""", "%r: f32[6], %c: f32[8]"), 4096),
    "floor_division": (group_text("%a: f32[8, 16], %b: f32[8, 16]", """
        %q = aten.div.Tensor_mode(%a, %b) {rounding_mode = "floor"} : f32[8, 16]""",
                                  "%q: f32[8, 16]"), 4096),
    "bf16_trunc_division": (group_text("%a: bf16[8, 16], %b: bf16[8, 16]", """
        %q = aten.div.Tensor_mode(%a, %b) {rounding_mode = "trunc"} : bf16[8, 16]""",
                                       "%q: bf16[8, 16]"), 4096),
    "symbolic_var": (group_text("%a: f32[s0, s1]", """
        %v = aten.var.correction(%a) {dim = [1], correction = 1} : f32[s0]""",
                                "%v: f32[s0]"), 4096),
    **{f"{name}_persistent": (text, 4096) for name, (text, _) in CASES.items()},
    **{f"{name}_looped": (text, 4) for name, (text, _) in CASES.items()},
}


def helpers_of(source: str) -> tuple[set[str], set[str]]:
    """(helpers the module defines, helpers its functions name and the helpers those
    name), read from its syntax."""
    tree = ast.parse(source)
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    defined = set(functions) & set(HELPERS)

    def names(f: ast.FunctionDef) -> set[str]:
        return {n.id for n in ast.walk(f) if isinstance(n, ast.Name) and n.id in HELPERS}
    named = set().union(*(names(f) for name, f in functions.items() if name not in HELPERS))
    for _ in HELPERS:  # (helpers calling helpers: to the fixed point)
        named |= set().union(*(names(functions[h]) for h in named if h in functions))
    return defined, named


def generate(registry, tmp_path, text: str, max_persistent: int) -> str:
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, max_persistent=max_persistent)
    return codegen.generate(next(parse_graph(text).nodes), registry).source


def test_a_gelu_kernel_module_holds_no_helper(registry, tmp_path):
    source = generate(registry, tmp_path, GELU, 4096)
    assert helpers_of(source) == (set(), set())
    assert "_welford_combine" not in source and "_argmax_combine" not in source
    assert source.count("@triton.jit") == 1
    assert "import triton.language as tl\nfrom triton.language.extra import libdevice\n\n\n" \
           "@triton.jit\ndef fused_gelu(" in source


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_a_module_defines_exactly_the_helpers_its_kernels_call(registry, tmp_path, name):
    text, max_persistent = GROUPS[name]
    defined, named = helpers_of(generate(registry, tmp_path, text, max_persistent))
    assert defined == named


def test_between_them_the_groups_call_every_helper(registry, tmp_path):
    """The corpus above reaches every helper (so the test before covers each one), and
    the forms that need one get it: Welford in a looped var, arg-combines, bf16 rounding
    in software on the CPU, the split and row + column kernels' finishing combines."""
    sources = {name: generate(registry, tmp_path, *GROUPS[name]) for name in GROUPS}
    called = {name: helpers_of(source)[1] for name, source in sources.items()}
    # the forms named: a finishing kernel, variants, a looped Welford
    assert "def _finish(" in sources["split_sum"]
    assert "def _finish(" in sources["row_and_column_sums"]
    assert "_looped(" in sources["symbolic_var"]
    assert set().union(*called.values()) == set(HELPERS)
    assert called["gelu"] == set()
    assert called["maximum_minimum"] == {"_maximum", "_minimum"}
    assert called["bf16_casts"] == {"_round_to_bf16"}
    assert called["floor_division"] == {"_div_floor", "_low", "_round_to_bf16"}
    assert called["bf16_trunc_division"] == {"_low", "_round_to_bf16"}
    assert called["split_sum"] == {"_add"}
    assert called["var_unbiased_looped"] == {"_welford_combine"}
    assert called["argmax_argmin_ties_nan_persistent"] == {"_argmax_combine",
                                                           "_argmin_combine"}


def test_a_gpu_kernel_rounds_bf16_in_hardware_and_defines_no_rounding_helper(registry,
                                                                            tmp_path):
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False).for_target("sm_90")
    group = next(on_device(parse_graph(GROUPS["bf16_casts"][0]), "cuda").nodes)
    assert helpers_of(codegen.generate(group, registry).source) == (set(), set())
