"""IR text a hostile tester wrote (issue #40): integer literals past the digits Python
converts are parse errors naming line and column, and what parses prints back to text
that parses (a dim ``a.b`` was accepted, printed ``"a.b"`` and then rejected)."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.cli import main
from torchloom.errors import ParseError
from torchloom.ir.text import parse_graph, print_graph

BIG = "9" * (sys.get_int_max_str_digits() + 700)


def _graph(param_type: str, attrs: str = "") -> str:
    return (f"graph @g(%x: {param_type}) {{\n"
            f"  %y = aten.add.Tensor(%x, %x){attrs} : {param_type}\n"
            f"  return %y\n}}\n")


@pytest.mark.parametrize("text, line, column", [
    (_graph("f32[4]", f" {{other = {BIG}}}"), 2, 41),
    (_graph("f32[4]", f" {{other = -{BIG}}}"), 2, 41),
    (_graph("f32[4]", f" {{other = [1, {BIG}]}}"), 2, 45),
    (_graph("f32[4]", f" {{tensors = [${BIG}]}}"), 2, 44),
    (_graph(f"f32[{BIG}, 4]"), 1, 18),
    (_graph(f"f32[4] strided[{BIG}]"), 1, 29),
], ids=["attr", "negative", "in-list", "input-ref", "dim", "stride"])
def test_an_int_literal_too_long_for_python_is_a_parse_error(text, line, column):
    with pytest.raises(ParseError) as err:
        parse_graph(text, "big.ir")
    assert (err.value.line, err.value.column) == (line, column)
    message = str(err.value)
    assert message.startswith(f"big.ir:{line}:{column}: integer literal of ")
    assert "is too long" in message and len(message) < 200  # not the digits themselves


def test_opt_reports_a_too_long_literal_as_a_user_error(tmp_path, capsys):
    path = tmp_path / "big.ir"
    path.write_text(_graph(f"f32[{BIG}, 4]"))
    code = main(["opt", str(path), "--passes", "cse"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}:1:18: integer literal of {len(BIG)} digits is too long" in err
    assert "Traceback" not in err and BIG not in err


def test_a_long_quoted_dim_is_named_shortened():
    with pytest.raises(ParseError) as err:
        parse_graph(_graph(f'f32["{BIG}", 4]'))
    assert str(err.value).startswith("1:18: dim '999") and len(str(err.value)) < 600


def test_the_reported_dotted_symbol_is_rejected_at_line_and_column():
    with pytest.raises(ParseError) as err:
        parse_graph("graph @g(%x: f32[4, 2]) {\n  return %x\n}\n"
                    "graph @h(%x: f32[a.b, 4]) {\n  return %x\n}\n", "dot.ir")
    assert str(err.value).startswith("dot.ir:4:18: dim 'a.b' is not a size symbol")


def test_symbols_the_printer_writes_bare_parse_back():
    text = _graph("f32[s0, N, _k2, print] strided[1, s0, x_y, 4]")
    g = parse_graph(text)
    assert g.inputs[0].type.shape == ("s0", "N", "_k2", "print")
    assert print_graph(parse_graph(print_graph(g))) == print_graph(g) == text


ODD_SYMBOLS = st.one_of(
    st.sampled_from(["a.b", "a..b", "s0.x", ".s0", "s0.", "if", "lambda", "True", "None",
                     "False", "Max", "FloorDiv", "ceiling", "print", "_", "__", "s0", "u3",
                     "N", "x_1", "0s", "s0 + 1", "Max(s0, 2)", "Max(s0)", "s0[0]", "a.b + 1",
                     "s0**70", "", " ", "-1", "?", "\"", "s0,", "é"]),
    st.from_regex(r"[A-Za-z_.][A-Za-z0-9_.]{0,6}", fullmatch=True),
    st.text(alphabet="ab01_.+*()/ ,-%", max_size=8))


@settings(max_examples=300, deadline=None)
@given(ODD_SYMBOLS, st.booleans(), st.booleans())
def test_any_dim_spelling_parses_to_text_that_parses_or_is_a_parse_error(symbol, quoted,
                                                                         as_stride):
    """The property: a dim the parser accepts prints to text the parser accepts, and that
    prints the same; anything else is a ParseError with a line and a column."""
    dim = json.dumps(symbol) if quoted else symbol
    param = f"f32[4] strided[{dim}]" if as_stride else f"f32[{dim}, 4]"
    try:
        g = parse_graph(_graph(param))
    except ParseError as exc:
        assert exc.line >= 1 and exc.column >= 1
        return
    printed = print_graph(g)
    again = parse_graph(printed)
    assert print_graph(again) == printed
    assert again.inputs[0].type == g.inputs[0].type


@pytest.mark.parametrize("text, where, message", [
    ('graph @"a\\q"() {\n  return\n}\n', "1:10:", "Invalid \\escape"),
    ('graph @g(%x: f32[4]) {\n  %y = my.op(%x) {k = "a\\qb"} : f32[4]\n  return %y\n}\n',
     "2:25:", "Invalid \\escape"),
    ('graph @g(%x: f32[4]) {\n  %y = my.op(%x) {k = "a\tb"} : f32[4]\n  return %y\n}\n',
     "2:25:", "Invalid control character"),
    ('graph @g(%x: f32["\\x", 4]) {\n  return %x\n}\n', "1:19:", "Invalid \\escape"),
    ('graph @g(%x: f32[4]) {\n  %y = my.op(%x) {k = "a\nb"} : f32[4]\n  return %y\n}\n',
     "2:23:", "unexpected character"),
], ids=["graph-name", "attr-escape", "attr-tab", "dim-escape", "attr-newline"])
def test_a_bad_string_literal_is_a_parse_error_at_its_character(text, where, message):
    """json.loads' JSONDecodeError (a ValueError) escaped the parser as a traceback."""
    with pytest.raises(ParseError) as err:
        parse_graph(text)
    assert str(err.value).startswith(where) and message in str(err.value)


def test_strings_with_escapes_round_trip():
    text = ('graph @"a\\"b\\n"(%x: f32[4]) {\n'
            '  %y = my.op(%x) {k = "tab\\t quote\\" \\u00e9 \\\\"} : f32[4]\n  return %y\n}\n')
    g = parse_graph(text)
    assert g.name == 'a"b\n' and list(g.nodes)[0].attrs["k"] == 'tab\t quote" \xe9 \\'
    assert print_graph(parse_graph(print_graph(g))) == print_graph(g)
