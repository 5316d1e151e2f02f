"""The statement IR (torchloom.codegen.stmt): facts found when a statement is built, masking,
dead-declaration removal and loop rewrites over the structure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from torchloom.api import stmt
from torchloom.codegen.expr import POSTFIX, PRODUCT, SUM, Literal, Load, Name, Op, paren
from torchloom.codegen.stmt import (Assign, Block, Declare, Element, If, Loop, Raw, Select, Store,
                                    Unpack, Update)


def test_scan_finds_names_elements_and_calls():
    found = stmt.scan("tl_exp(in_a[x * 8 + r]) + b1 * expf(c)")
    assert {"tl_exp", "in_a", "x", "r", "b1", "expf", "c"} <= found.names
    assert found.elements == (Element("in_a", "x * 8 + r"),)
    assert found.calls == {"tl_exp", "expf"} and not found.nested


def test_an_index_holding_another_is_nested():
    found = stmt.scan("a[b[i]]")
    assert found.nested and found.elements == (Element("b", "i"),)


def test_a_store_touches_its_target_first():
    s = Store(Element("out_y", "x"), "in_a[x] + t1")
    assert [e.pointer for e in s.facts.elements] == ["out_y", "in_a"]


def test_masked_keeps_declarations_and_masks_side_effects_into_names():
    d = Declare("float", "t1", "a + b")
    assert stmt.masked(d, "r >= 16") is d
    assert stmt.masked(Update("acc", "+=", "t1"), "m").mask == "m"
    assert stmt.masked(Select("acc", "t1 > acc", "t1"), "m").mask == "m"
    assert stmt.masked(Store(Element("o", "r"), "t1"), "m").mask == "m"
    # an accumulation into an element (a column's partial), a raw line, a loop: no mask
    assert stmt.masked(Update(Element("colpart", "r"), "+=", "t1"), "m") is None
    assert stmt.masked(Raw("if (a) { b = c; }"), "m") is None
    assert stmt.masked(Loop("r", "0", "8", ()), "m") is None


def test_drop_unused_removes_declarations_nothing_after_reads_at_any_depth():
    body = [Declare("int64_t", "x0", "x / 8"),        # read by the loop's store: kept
            Declare("int64_t", "x1", "x % 8"),        # read by nothing: dropped
            Loop("r", "0", "n", head=(Declare("int64_t", "r0", "r / 4"),),  # unread: dropped
                 body=(Declare("float", "t", "in_a[x0 * 4 + r]"),
                       Store(Element("out", "r"), "t")))]
    kept = stmt.drop_unused(body)
    assert [s.name for s in kept if isinstance(s, Declare)] == ["x0"]
    (loop,) = [s for s in kept if isinstance(s, Loop)]
    assert loop.head == () and [type(s) for s in loop.body] == [Declare, Store]


def test_a_name_a_later_statement_declares_again_keeps_the_earlier_one():
    # program order, as the lines read: a later declaration of the same name counts as a use
    body = [Loop("r", "0", "4", head=(Declare("int64_t", "r0", "r / 2"),),
                 body=(Store(Element("p", "r"), "1"),)),
            Loop("r", "0", "4", head=(Declare("int64_t", "r0", "r / 2"),),
                 body=(Store(Element("o", "r0"), "1"),))]
    kept = stmt.drop_unused(body)
    assert [len(loop.head) for loop in kept] == [1, 1]


def test_drop_unused_sees_names_in_loop_bounds_and_branches():
    body = [Declare("int64_t", "n", "m * 2"), Declare("int64_t", "k", "m + 1"),
            If("k > 0", (Loop("r", "0", "n", (Store(Element("o", "r"), "1"),)),),
               (Raw("q = 0;"),))]
    assert [s.name for s in stmt.drop_unused(body) if isinstance(s, Declare)] == ["n", "k"]


def test_drop_unused_removes_loops_left_with_nothing_to_do():
    """A loop whose body is only unread declarations goes, with the declarations only its
    bounds read (a SIMD loop over a row whose values all moved before it); a loop storing
    anything, running a raw line, or assigning a name in its head that a later statement
    reads, stays; branches and blocks likewise."""
    body = [Declare("int64_t", "j1", "j0 + 16"),
            Loop("x", "0", "4", (
                Declare("float", "t", "in_a[x]"), Store(Element("out", "x"), "t"),
                Loop("j", "0", "j1", (Declare("float", "u", "in_b[j]"),)))),
            Loop("r", "0", "8", (Loop("q", "0", "2", (Declare("float", "w", "1"),)),)),
            Loop("r", "0", "8", (Raw("asm(\"\");"),)),
            Loop("i", "0", "4", (Declare("float", "v", "1"),), head=(Assign("k", "i * 2"),)),
            Store(Element("out", "0"), "k")]
    kept = stmt.drop_unused(body)
    assert [type(s) for s in kept] == [Loop, Loop, Loop, Store]
    assert [type(s) for s in kept[0].body] == [Declare, Store]
    assert isinstance(kept[1].body[0], Raw)
    # (an assignment in a loop's head, read after it: Python's loops keep their names)
    assert kept[2].head == (Assign("k", "i * 2"),) and kept[2].body == ()
    # a branch or a block left empty goes too, and what only its condition read
    body = [Declare("int64_t", "t", "n - 16"), If("t < n", (Loop("r", "t", "n", ()),)),
            Block((Declare("float", "w", "2"),)),
            If("n > 0", (), (Store(Element("o", "0"), "1"),))]
    kept = stmt.drop_unused(body)
    assert [type(s) for s in kept] == [If] and kept[0].then == ()


def test_map_loops_rewrites_nested_loops_inner_first():
    inner = Loop("j", "0", "8", ())
    outer = Loop("x", "0", "4", (inner,))
    seen = []

    def change(loop):
        seen.append(loop.var)
        return Loop(loop.var, loop.start, "9", loop.body, loop.head, loop.annotation)

    (out,) = stmt.map_loops([If("c", (outer,))], change).pop().then
    assert seen == ["j", "x"] and out.end == "9" and out.body[0].end == "9"
    assert [s.var for s in stmt.walk([outer]) if isinstance(s, Loop)] == ["x", "j"]


def test_a_block_is_walked_kept_and_rewritten_like_a_branch():
    """A scope of its own (a parallel region): its statements are walked in program order,
    what nothing reads is dropped inside it, a read inside it keeps a declaration before
    it, its loops are rewritten, and its annotation's names count as mentioned."""
    class Pragma:
        names = frozenset({"nthreads"})

    body = [Declare("int64_t", "n", "m * 2"), Declare("int64_t", "nthreads", "4"),
            Declare("int64_t", "unused", "m + 1"),
            Block((Declare("int64_t", "dead", "n + 1"),
                   Loop("x", "0", "n", (Store(Element("out", "x"), "1"),))), Pragma())]
    kept = stmt.drop_unused(body)
    assert [s.name for s in kept if isinstance(s, Declare)] == ["n", "nthreads"]
    (block,) = [s for s in kept if isinstance(s, Block)]
    assert [type(s) for s in block.body] == [Loop] and block.annotation is body[-1].annotation
    assert [type(s) for s in stmt.walk(body)][3:] == [Block, Declare, Loop, Store]
    (changed,) = stmt.map_loops([body[-1]], lambda loop: Loop(loop.var, "1", loop.end,
                                                              loop.body))
    assert changed.body[1].start == "1" and changed.body[0] == body[-1].body[0]


def test_assignments_are_dropped_as_declarations_and_rebinding_counts_as_a_read():
    # a target without declarations (Triton): an accumulator bound again reads itself
    body = [Assign("x0", "xindex // 8"), Assign("x1", "xindex % 8"),       # x1: unread
            Assign("acc", "tl.full([8], 0.0, tl.float32)"),
            Loop("roff", "0", "n", step="RBLOCK",
                 head=(Assign("rindex", "roff + tl.arange(0, 8)"),),
                 body=(Assign("acc", "acc + rindex * x0"),)),
            Store(Element("out", "x0"), "acc", "xmask")]
    kept = stmt.drop_unused(body)
    assert [s.name for s in stmt.walk(kept) if isinstance(s, Assign)] == [
        "x0", "acc", "rindex", "acc"]


def test_an_unpacking_stays_while_any_of_its_names_is_read():
    """``a, b = expr`` binds its names together: kept when a later statement reads one of
    them, dropped when none; its expression's names count as read; an accumulator pair
    bound again in a loop reads itself."""
    pair = Op("tl.reduce(({0}, {1}), 1, _argmax_combine, keep_dims=True)", POSTFIX,
              (Name("m"), Name("idx")))
    used = [Assign("m", "x"), Assign("idx", "r"), Unpack(("v", "i"), pair),
            Store(Element("out", "x0"), "i", None)]
    assert [type(s) for s in stmt.drop_unused(used)] == [Assign, Assign, Unpack, Store]
    unread = [Assign("m", "x"), Assign("idx", "r"), Unpack(("v", "i"), pair)]
    assert stmt.drop_unused(unread) == []
    loop = [Assign("a", "0"), Assign("b", "0"),
            Loop("r", "0", "n", body=(Unpack(("a", "b"), "_combine(a, b, r)"),)),
            Store(Element("out", "x0"), "b", None)]
    kept = stmt.drop_unused(loop)
    assert [s.name for s in kept if isinstance(s, Assign)] == ["a", "b"]
    assert {"a", "b", "r", "_combine"} <= Unpack(("a", "b"), "_combine(a, b, r)").names


def test_a_loop_step_is_a_name_the_loop_reads():
    body = [Assign("step", "2 * k"),
            Loop("i", "0", "n", (Store(Element("o", "i"), "1"),), step="step")]
    assert [type(s) for s in stmt.drop_unused(body)] == [Assign, Loop]


def _pure(facts) -> bool:
    return facts.calls <= {"powf", "sqrtf"} and all(e.pointer.startswith("in_")
                                                    for e in facts.elements)


def test_invariant_moves_declarations_no_iteration_changes():
    from torchloom.codegen.stmt import Var
    body = [Declare("float", "t", "in_t[0]"),
            Declare("float", "s", "powf(0.9f, t)"),          # reads a moved name
            Declare("int64_t", "row", "x / 4"),               # the loop variable
            Declare("float", "a", "in_p[row] * s"),           # a coordinate
            Declare("float", "m", "malloc(16)"),              # a call with effects
            Declare("float", "o", "out_y[0]"),                # memory the loop writes
            Declare("float", "q", "in_w[0]"),                 # written below
            Var("float", "acc", "0"),
            Declare("float", "u", "acc + s"),                 # a variable
            Raw("float buf[16];"),
            Declare("float", "b", "buf[0] + s"),              # a raw line's name
            Declare("float", "k", "sqrtf(s) + 1.0f"),
            Store(Element("out_y", "x"), "a + k + u + b + o + q + m"),
            Store(Element("in_w", "x"), "a")]
    moved, kept = stmt.invariant(body, "x", _pure)
    assert [s.name for s in moved] == ["t", "s", "k"]
    assert [getattr(s, "name", None) for s in kept] == [
        "row", "a", "m", "o", "q", "acc", "u", None, "b", None, None]


def test_invariant_sees_names_declared_in_nested_loops():
    inner = Loop("j", "0", "16", (Declare("float", "v", "in_p[x * 16 + j]"),))
    body = [inner, Declare("float", "w", "v * 2.0f"), Declare("float", "c", "in_c[0]")]
    moved, kept = stmt.invariant(body, "x", _pure)
    assert [s.name for s in moved] == ["c"] and kept[:2] == body[:2]


# ---- expressions as trees: what a statement reads is found by walking its nodes ----

def _x16_r():
    return Op("{0} + {1}", SUM, (Op("{0} * {1}", PRODUCT, (Name("x"), Literal("16", 16))),
                                  Name("r")))


def test_scan_walks_a_tree_loads_are_elements_with_their_offset_node():
    offset = _x16_r()
    e = Op("tl_exp({0}) * {1}", PRODUCT, (Load("in_a", offset), Name("b1")))
    found = stmt.scan(e)
    assert found.names == {"tl_exp", "in_a", "x", "r", "b1"}  # no literal's digits
    assert found.elements == (Element("in_a", offset),) and found.elements[0].offset is offset
    assert found.calls == {"tl_exp"} and not found.nested


def test_a_load_whose_offset_loads_is_nested_and_not_an_element():
    found = stmt.scan(Load("a", Load("b", Name("i"))))
    assert found.nested and found.elements == (Element("b", Name("i")),)


def test_a_literal_cast_names_nothing_so_invariant_moves_its_declaration():
    # a raw line declaring with the literal's cast type ("float") used to pin the
    # declaration in the loop: text scanning counted the cast as a name
    add = Declare("float", "add8", Op("{0} + {1}", SUM, (Name("add7"),
                                                        Literal("((float)1e-05)", 1e-05))))
    body = [Raw("float acc_sum1 = 0;"), add, Store(Element("out", Name("x")), Name("add8"))]
    moved, kept = stmt.invariant(body, "x", _pure)
    assert moved == [add] and add not in kept


def test_a_store_target_is_an_element_of_the_tree_offset():
    s = Store(Element("out0", _x16_r()), Load("in_a", Name("r")))
    assert [(e.pointer, str(e.offset)) for e in s.facts.elements] == [
        ("out0", "x * 16 + r"), ("in_a", "r")]


_POINTERS = ("in_a", "in_b", "out_c")


@st.composite
def _reads(draw, depth=3):
    """A tree of names, loads at tree offsets, calls and operators (no literals: a
    literal's spelling names nothing, its text may)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return Name(draw(st.sampled_from(["x", "r", "t1", "acc"])))
    kind = draw(st.sampled_from(["load", "call", "op", "opaque"]))
    if kind == "load":
        return Load(draw(st.sampled_from(_POINTERS)), draw(_reads(depth - 1)))
    if kind == "opaque":
        return Op(draw(st.sampled_from(["xmask & rmask", "r / 4", "in_b[j0]"])))
    a, b = draw(_reads(depth - 1)), draw(_reads(depth - 1))
    if kind == "call":
        return Op(f"{draw(st.sampled_from(['expf', 'tl_exp', 'fmaxf']))}({{0}}, {{1}})",
                  POSTFIX, (a, b))
    return Op("{0} * {1}", PRODUCT, (paren(a, PRODUCT), paren(b, PRODUCT + 1)))


@given(_reads())
@settings(max_examples=300, deadline=None)
def test_scanning_a_tree_finds_what_its_text_holds(e):
    tree, text = stmt.scan(e), stmt.lexed(str(e))
    assert tree.names == text.names and tree.calls == text.calls
    assert tree.nested == text.nested
    assert sorted((p.pointer, str(p.offset)) for p in tree.elements) == \
        sorted((p.pointer, str(p.offset)) for p in text.elements)


def test_an_array_declares_its_name_and_touches_no_element():
    from torchloom.codegen.stmt import Array
    arr = Array("float", "acc_sum1", Op("{0} * {1}", PRODUCT, (Name("n"), Literal("16", 16))))
    assert arr.facts.elements == () and arr.names == {"acc_sum1", "n", "float"}
    read = Declare("float", "v", Load("acc_sum1", Name("r")))
    # the array is the loop's own: a declaration reading it stays in the loop
    moved, kept = stmt.invariant([arr, read], "x", _pure)
    assert moved == [] and kept == [arr, read]
    # never dropped as unused (a store after it may be its only mention)
    assert stmt.drop_unused([arr]) == [arr]


def test_a_masked_statement_names_what_its_mask_reads():
    """``masked`` (and any ``attrs.evolve``) scans the new statement again: a declaration
    only the mask reads is kept by drop_unused (it had been dropped: the facts were the
    unmasked statement's)."""
    for s in (Update("acc", "+=", Name("v")), Store(Element("out", Name("r")), Name("v")),
              Select("acc", Op("{0} > {1}", SUM, (Name("v"), Name("acc"))), Name("v"))):
        m = stmt.masked(s, Op("{0} >= {1}", SUM, (Name("r"), Name("r_edge"))))
        assert "r_edge" in m.names and "r_edge" not in s.names
        kept = stmt.drop_unused([Declare("int64_t", "r_edge", Literal("32", 32)), m])
        assert [type(k) for k in kept] == [Declare, type(s)]
