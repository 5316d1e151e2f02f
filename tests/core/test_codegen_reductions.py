"""torchloom.api.reductions: the reduction ops' table the native codegens share."""

from torchloom.api import reductions


def test_sqrt_spelling_fills_only_std():
    c = reductions.reduction_table("sqrt$f({x})")
    t = reductions.reduction_table("tl.sqrt_rn({x})")
    assert c["aten.std.correction"].outputs == ("sqrt$f({acc} / {dof})",)
    assert t["aten.std.correction"].outputs == ("tl.sqrt_rn({acc} / {dof})",)
    differ = [op for op in c if c[op] != t[op]]
    assert differ == ["aten.std.correction"]


def test_kinds_keep_only_those_kinds_in_order():
    full = reductions.reduction_table("sqrt({x})")
    kept = reductions.reduction_table("sqrt({x})", kinds=frozenset({"sum", "var"}))
    assert list(kept) == [op for op, spec in full.items() if spec.kind in {"sum", "var"}]
    assert "aten.prod.default" in full and "aten.prod.default" not in kept
    assert kept["aten.mean.dim"].outputs == ("{acc} / {n}",)


def test_results_fill_each_outputs_template_in_order():
    from torchloom.api import parse_graph

    g = parse_graph("""graph @g(%x: f32[4, 8]) {
  %v, %m = aten.var_mean.correction(%x) {dim = [1]} : f32[4], f32[4]
  return %v, %m
}""")
    node = next(g.nodes)
    spec = reductions.reduction_table("sqrt({x})")[node.op]
    seen = []
    out = reductions.results(node, spec, {"acc": "a", "n": "8", "mean": "mu", "dof": "7"},
                             ("x",), lambda v, code: seen.append(v.name) or code)
    assert seen == ["v", "m"]
    # each output's template filled in as an expression node (the fields' text inside)
    assert {v: (row, str(code)) for v, (row, code) in out.items()} == {
        node.outputs[0]: (("x",), "a / 7"), node.outputs[1]: (("x",), "mu")}
