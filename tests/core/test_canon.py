"""Structural hash: alpha-equivalent graphs hash equal; any real change changes the hash."""

from __future__ import annotations

import keyword

import pytest
from hypothesis import given, settings, strategies as st

from torchloom.ir import alpha_equivalent, canonical_text, parse_graph, structural_hash
from torchloom.ir.symbols import FUNCTIONS

BASE = """\
graph @g(%x: f32[4, 8], %y: f32[8]) {
  %t = aten.t.default(%x) : f32[8, 4] strided[1, 8]
  %e, %r = torchloom.fusion_group(%x, %y) : f32[4, 8], f32[4] region @group0(%a: f32[4, 8], %b: f32[8]) {
    %s = aten.add.Tensor(%a, %b) {alpha = 1} : f32[4, 8]
    %e = aten.exp.default(%s) : f32[4, 8]
    %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4]
    return %e, %r
  }
  %m = aten.mul.Tensor(%e, %x) : f32[4, 8]
  return %m, %r, %t
}
"""

RENAMED = """\
graph @other_name(%p0: f32[4, 8], %q: f32[8]) {
  %transposed = aten.t.default(%p0) : f32[8, 4] strided[1, 8]
  %u, %v = torchloom.fusion_group(%p0, %q) : f32[4, 8], f32[4] region @kernel7(%in0: f32[4, 8], %in1: f32[8]) {
    %k = aten.add.Tensor(%in0, %in1) {alpha = 1} : f32[4, 8]
    %l = aten.exp.default(%k) : f32[4, 8]
    %o = aten.sum.dim_IntList(%l) {dim = [-1]} : f32[4]
    return %l, %o
  }
  %w = aten.mul.Tensor(%u, %p0) : f32[4, 8]
  return %w, %v, %transposed
}
"""


def test_alpha_renamed_graphs_hash_equal():
    a, b = parse_graph(BASE), parse_graph(RENAMED)
    assert structural_hash(a) == structural_hash(b)
    assert alpha_equivalent(a, b)
    assert canonical_text(a) == canonical_text(b)
    assert "%" not in canonical_text(a) and "group0" not in canonical_text(a)


def test_hash_is_stable_across_parses_and_clones():
    g = parse_graph(BASE)
    assert structural_hash(g) == structural_hash(parse_graph(BASE)) == structural_hash(g.clone())
    assert len(structural_hash(g)) == 64


CHANGES = {
    "op": ("aten.mul.Tensor(%e, %x)", "aten.add.Tensor(%e, %x)"),
    "region op": ("aten.exp.default(%s)", "aten.sin.default(%s)"),
    "attribute value": ("{dim = [-1]}", "{dim = [1]}"),
    "attribute int vs float": ("{alpha = 1}", "{alpha = 1.0}"),
    "attribute int vs bool": ("{alpha = 1}", "{alpha = true}"),
    "attribute name": ("{alpha = 1}", "{beta = 1}"),
    "attribute added": ("aten.exp.default(%s)", "aten.exp.default(%s) {x = 0}"),
    "shape": ("%y: f32[8]) {", "%y: f32[1]) {"),
    "dtype": ("%y: f32[8]) {", "%y: f16[8]) {"),
    "stride": (": f32[8, 4] strided[1, 8]", ": f32[8, 4] strided[1, 16]"),
    "stride vs contiguous": (": f32[8, 4] strided[1, 8]", ": f32[8, 4]"),
    "device": ("%y: f32[8]) {", "%y: f32[8] @cuda:0) {"),
    "symbolic dim": ("%y: f32[8]) {", "%y: f32[s0]) {"),
    "wiring": ("aten.mul.Tensor(%e, %x)", "aten.mul.Tensor(%x, %e)"),
    "region wiring": ("aten.add.Tensor(%a, %b)", "aten.add.Tensor(%b, %a)"),
    "output order": ("return %m, %r, %t", "return %r, %m, %t"),
    "region output": ("    return %e, %r", "    return %s, %r"),
}


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_any_change_changes_the_hash(what):
    old, new = CHANGES[what]
    assert BASE.count(old) >= 1
    changed_text = BASE.replace(old, new, 1)
    if what in ("shape", "dtype", "device", "symbolic dim"):  # keep the region consistent
        changed_text = changed_text.replace("%b: f32[8]", "%b: " + new.split(": ")[1][:-3])
    changed = parse_graph(changed_text)
    assert structural_hash(changed) != structural_hash(parse_graph(BASE)), what
    assert not alpha_equivalent(changed, parse_graph(BASE))


def test_swapping_two_inputs_of_the_same_type_changes_wiring_hash():
    a = parse_graph("graph @g(%x: f32[2], %y: f32[2]) {\n  %s = aten.sub.Tensor(%x, %y) : f32[2]\n"
                    "  return %s\n}\n")
    b = parse_graph("graph @g(%y: f32[2], %x: f32[2]) {\n  %s = aten.sub.Tensor(%x, %y) : f32[2]\n"
                    "  return %s\n}\n")
    assert structural_hash(a) != structural_hash(b)


# Symbols inside attributes (a view's size list) are numbered with the types' symbols.
SYMBOLIC = """\
graph @g(%x: f32[A, B, 8], %y: f32[B, 8]) {
  %v = aten.view.default(%x) {size = ["A*B", 8]} : f32["A*B", 8]
  %w = aten.view.default(%y) {size = ["B", 8]} : f32[B, 8]
  %e = aten.expand.default(%w) {size = ["A", "B", 8]} : f32[A, B, 8]
  %m = aten.mul.Tensor(%e, %x) : f32[A, B, 8]
  return %v, %m
}
"""


def _renamed_text(text: str, names: dict[str, str]) -> str:
    import re
    return re.sub(r"\b(A|B)\b", lambda m: names[m.group(1)], text)


_SYMBOL_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,4}", fullmatch=True).filter(
    lambda s: s not in FUNCTIONS and s not in {"f32", "graph", "return", "size"}
    and not keyword.iskeyword(s))  # a size expression is Python arithmetic: "as" is no name


@settings(max_examples=60, deadline=None)
@given(st.lists(_SYMBOL_NAMES, min_size=2, max_size=2, unique=True))
def test_renaming_symbols_everywhere_keeps_the_hash(names):
    renamed = _renamed_text(SYMBOLIC, dict(zip("AB", names)))
    assert structural_hash(parse_graph(renamed)) == structural_hash(parse_graph(SYMBOLIC))


# each: one attribute occurrence of a symbol changed (types untouched)
ATTR_CHANGES = [('{size = ["B", 8]}', '{size = ["A", 8]}'),
                ('{size = ["A", "B", 8]}', '{size = ["B", "B", 8]}'),
                ('{size = ["A", "B", 8]}', '{size = ["A", "A", 8]}'),
                ('{size = ["A*B", 8]}', '{size = ["B*A", 8]}'),
                ('{size = ["A*B", 8]}', '{size = ["A*A", 8]}'),
                ('{size = ["B", 8]}', '{size = ["s0", 8]}'),  # the renamed text, as a string
                ('{size = ["B", 8]}', '{size = [4, 8]}')]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ATTR_CHANGES), st.lists(_SYMBOL_NAMES, min_size=2, max_size=2,
                                                 unique=True))
def test_changing_one_symbol_in_an_attribute_changes_the_hash(change, names):
    old, new = change
    changed = SYMBOLIC.replace(old, new, 1)
    assert changed != SYMBOLIC
    rename = dict(zip("AB", names))
    assert structural_hash(parse_graph(_renamed_text(changed, rename))) != \
        structural_hash(parse_graph(SYMBOLIC))


def test_a_plain_string_attribute_is_not_a_symbol():
    """A string attribute that names no symbol of the graph's types stays a quoted string:
    two different strings never hash equal, even when both would parse as a symbol."""
    text = """graph @g(%x: f32[A, 8]) {
      %y = aten.gelu.default(%x) {approximate = "none"} : f32[A, 8]
      return %y
    }"""
    other = text.replace('"none"', '"tanh"')
    assert structural_hash(parse_graph(text)) != structural_hash(parse_graph(other))
    assert structural_hash(parse_graph(text.replace("A", "Z"))) == \
        structural_hash(parse_graph(text))


def test_an_int_that_is_a_size_is_numbered_with_the_tensor_symbols():
    """``int[s4]`` renames with the dims: the same group over other symbol names hashes
    equal, and one whose int is another size than its tensor's dim hashes apart (a kernel
    cached for the one would read the wrong size for the other)."""
    text = """graph @g(%x: f32[{a}, 4], %n: int[{b}]) {{
  %y = aten.mul.Tensor(%x) {{other = 2}} : f32[{a}, 4]
  return %y
}}"""
    same = structural_hash(parse_graph(text.format(a="s4", b="s4")))
    assert structural_hash(parse_graph(text.format(a="s7", b="s7"))) == same
    assert structural_hash(parse_graph(text.format(a="s5", b="s4"))) != same
    assert structural_hash(parse_graph(text.format(a="s5", b="s4"))) == \
        structural_hash(parse_graph(text.format(a="s0", b="s9")))
