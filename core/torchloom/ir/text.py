"""The IR's text form: an MLIR-like printer and a parser that reads it back exactly.

```
graph @gelu(%x: f32[8192, 3072]) {
  %v = aten.view.default(%x) {size = [8192, 3072]} : f32[8192, 3072]
  %g = aten.gelu.default(%v) : f32[8192, 3072]
  return %g
}
```

Types: ``f32[8, 4]``, optionally followed by ``strided[1, 8]`` (non-contiguous) and
``@cuda:0`` (non-CPU device); dims are ints, symbols, quoted size expressions (``"2*s0"``,
checked by :func:`torchloom.ir.symbols.parse_dim`) or ``?``; scalars are ``int``,
``float``, ``bool``, ``str``, ``none``, ``any``. Attribute values: ints, floats, strings,
``true``/``false``/``none``, lists ``[...]``, input references ``$i``, and torch enums
``#f32``, ``#contiguous_format``, ``#strided``, ``#cuda:0``, and torch operators an op
runs, ``#op:aten.native_dropout.default`` (checkpointing's ``run_with_rng_state``
takes one). A region node ends with
``region @name(%p: type, ...) { ... }``. Regions and lists nest at most
:data:`MAX_NESTING` deep (deeper text is a :class:`ParseError`, not a ``RecursionError``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import torch

from torchloom.errors import ParseError
from torchloom.ir.graph import Graph, Node, Value
from torchloom.ir.printer import (ENUMS, format_attr, format_attrs, format_dim, format_graph_name,
                                  format_type, print_graph, print_node)
from torchloom.ir.symbols import SymbolicDimError, is_symbol, parse_dim
from torchloom.ir.torch_ops import find_callable
from torchloom.ir.types import (DTYPE_NAMES, DTYPES, SCALAR_KINDS, InputRef, ScalarType, TensorType,
                                Type)

# words that are attribute values (a bare ``inf`` is an ident, so it can also be a name)
_KEYWORD_VALUES = {"true": True, "false": False, "none": None, "nan": math.nan, "inf": math.inf}

# ---------------------------------------------------------------------------- parsing

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+|//[^\n]*)
  | (?P<nl>\n)
  | (?P<value>%[A-Za-z0-9_]+)
  | (?P<ref>\$[0-9]+)
  | (?P<at>@(?:[A-Za-z0-9_:.\-]+|"(?:[^"\\\n]|\\[^\n])*"))
  | (?P<enum>\#[A-Za-z0-9_:.]+)
  | (?P<string>"(?:[^"\\\n]|\\[^\n])*")
  | (?P<number>-inf\b|-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[()\[\]{},:=?])
  | (?P<bad>.)
""", re.VERBOSE | re.DOTALL)

_EOF_PADDING = 4  # peek(offset) past the end reads "eof" without a bounds check
#: regions in regions, lists in lists: far beyond any real graph, far below the stack limit
MAX_NESTING = 100


class _Parser:
    def __init__(self, text: str, source: str | None):
        self.source = source
        tokens: list[tuple[str, str, int, int]] = []
        append = tokens.append
        line, col_base = 1, 0
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            if kind == "ws":
                continue
            if kind == "nl":
                line, col_base = line + 1, m.end()
            elif kind == "bad":
                raise ParseError(f"unexpected character {m.group()!r}", line,
                                 m.start() - col_base + 1, source)
            else:
                append((kind, m.group(), line, m.start() - col_base + 1))
        tokens.extend([("eof", "", line, len(text) - col_base + 1)] * _EOF_PADDING)
        self.tokens = tokens
        self.i = 0
        self.depth = 0  # open regions and attribute lists

    def nest(self, tok) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"regions or attribute lists nested more than {MAX_NESTING} "
                             f"levels deep", tok)

    # -- token helpers
    def peek(self, offset: int = 0):
        tokens = self.tokens
        i = self.i + offset
        return tokens[i] if i < len(tokens) else tokens[-1]

    def error(self, message: str, tok=None) -> ParseError:
        kind, text, line, col = tok or self.peek()
        found = "end of input" if kind == "eof" else repr(text if len(text) <= 80 else
                                                          text[:60] + "...")
        return ParseError(f"{message}, found {found}", line, col, self.source)

    def accept(self, text: str) -> bool:
        tok = self.tokens[self.i]  # self.i stays within the "eof" padding
        if tok[1] == text and (tok[0] == "punct" or tok[0] == "ident"):
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            raise self.error(f"expected {text!r}")

    def take(self, kind: str, what: str) -> str:
        tok = self.peek()
        if tok[0] != kind:
            raise self.error(f"expected {what}")
        self.i += 1
        return tok[1]

    def int_literal(self, tok, digits: str) -> int:
        """``digits`` (the token's text, or its digits after ``$``) as an int; a ParseError
        at ``tok``, not int()'s ValueError, past the digits Python converts."""
        try:
            return int(digits)
        except ValueError:  # the message leaves the literal out: it is thousands of digits
            raise ParseError(f"integer literal of {len(digits.lstrip('-'))} digits is too "
                             f"long (at most {sys.get_int_max_str_digits()})",
                             tok[2], tok[3], self.source) from None

    def take_name(self, what: str) -> str:
        """A graph name: ``@name``, or ``@"any text"`` for names with other characters."""
        tok = self.peek()
        text = self.take("at", what)[1:]
        return self.string_literal(tok, text, 1) if text.startswith('"') else text

    def string_literal(self, tok, text: str, offset: int = 0) -> str:
        """A quoted string (JSON's escapes) at ``tok``, ``offset`` characters in."""
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:  # a bad escape or a raw control character
            raise ParseError(f"bad string literal: {exc.msg}", tok[2],
                             tok[3] + offset + exc.pos, self.source) from None

    # -- grammar
    def parse_graph(self) -> Graph:
        self.expect("graph")
        g = self.parse_body(self.take_name("a graph name like @main"))
        while self.peek()[0] != "eof":  # shared subgraphs follow the main graph
            if self.peek()[1] != "graph":
                raise self.error("expected end of input or another graph after the graph")
            self.expect("graph")
            tok = self.peek()
            name = self.take_name("a subgraph name like @layer")
            if name in g.subgraphs or name == g.name:
                raise self.error(f"graph @{name} is defined twice", tok)
            g.add_subgraph(self.parse_body(name))
        return g

    def parse_body(self, name: str) -> Graph:
        g = Graph(name)
        scope: dict[str, Value] = {}
        self.expect("(")
        if not self.accept(")"):
            while True:
                tok = self.peek()
                vname = self.take("value", "a parameter like %x")[1:]
                self.expect(":")
                v = Value(vname, self.parse_type(), graph=g)
                self.define(g, scope, v, tok)
                g.inputs.append(v)
                if self.accept(")"):
                    break
                self.expect(",")
        self.expect("{")
        while not self.accept("return"):
            self.parse_node(g, scope)
        outs = []
        if self.peek()[0] == "value":
            outs.append(self.use(scope))
            while self.accept(","):
                outs.append(self.use(scope))
        g.outputs = outs
        self.expect("}")
        return g

    def define(self, g: Graph, scope: dict, v: Value, tok) -> None:
        if v.name in scope:
            raise self.error(f"%{v.name} is defined twice", tok)
        scope[v.name] = v
        g._names.add(v.name)

    def use(self, scope: dict) -> Value:
        tok = self.peek()
        name = self.take("value", "a value like %x")[1:]
        if name not in scope:
            raise ParseError(f"use of undefined value %{name}", tok[2], tok[3], self.source)
        return scope[name]

    def parse_node(self, g: Graph, scope: dict) -> None:
        result_toks = []
        if self.peek()[0] == "value":
            result_toks.append(self.peek())
            self.i += 1
            while self.accept(","):
                result_toks.append(self.peek())
                self.take("value", "a result name")
            self.expect("=")
        op = self.take("ident", "an op name like aten.add.Tensor")
        self.expect("(")
        inputs = []
        if not self.accept(")"):
            while True:
                inputs.append(self.use(scope))
                if self.accept(")"):
                    break
                self.expect(",")
        attrs = self.parse_attrs() if self.peek()[1] == "{" else {}
        self.expect(":")
        types: list[Type] = []
        if self.accept("("):
            self.expect(")")
        else:
            types.append(self.parse_type())
            while self.accept(","):
                types.append(self.parse_type())
        if len(types) != len(result_toks):
            raise self.error(f"{op} names {len(result_toks)} results but gives "
                             f"{len(types)} types", result_toks[0] if result_toks else None)
        region = None
        if self.accept("region"):
            self.nest(self.peek())
            region = self.parse_body(self.take_name("a region name like @g0"))
            self.depth -= 1
        node = Node(op, inputs, attrs, region)
        if region is not None:
            region.owner = node
        node.outputs = [Value(tok[1][1:], t, node, i, g) for i, (tok, t) in
                        enumerate(zip(result_toks, types))]
        for tok, v in zip(result_toks, node.outputs):
            self.define(g, scope, v, tok)
        g.insert(node)

    def parse_attrs(self) -> dict[str, Any]:
        self.expect("{")
        attrs: dict[str, Any] = {}
        if self.accept("}"):
            return attrs
        while True:
            tok = self.peek()
            key = self.take("ident", "an attribute name")
            if key in attrs:
                raise self.error(f"attribute {key!r} given twice", tok)
            self.expect("=")
            attrs[key] = self.parse_attr_value()
            if self.accept("}"):
                return attrs
            self.expect(",")

    def parse_attr_value(self) -> Any:
        kind, text, _, _ = tok = self.peek()
        self.i += 1
        if kind == "number":
            if text == "-inf":
                return -math.inf
            return float(text) if any(c in text for c in ".eE") else self.int_literal(tok, text)
        if kind == "string":
            return self.string_literal(tok, text)
        if kind == "ref":
            return InputRef(self.int_literal(tok, text[1:]))
        if kind == "enum":
            name = text[1:]
            if name in ENUMS:
                return ENUMS[name]
            if name.startswith("op:"):  # a torch operator an op runs
                op = find_callable(name[3:])
                if op is None:
                    raise self.error("no torch operator of that name", tok)
                return op
            try:
                return torch.device(name)
            except RuntimeError:
                raise self.error("unknown enum value", tok) from None
        if kind == "ident" and text in _KEYWORD_VALUES:
            return _KEYWORD_VALUES[text]
        if text == "[":
            items = []
            if self.accept("]"):
                return tuple(items)
            self.nest(tok)
            while True:
                items.append(self.parse_attr_value())
                if self.accept("]"):
                    self.depth -= 1
                    return tuple(items)
                self.expect(",")
        self.i -= 1
        raise self.error("expected an attribute value")

    def parse_type(self) -> Type:
        tok = self.peek()
        word = self.take("ident", "a type like f32[4, 4] or int")
        if word in SCALAR_KINDS:
            if word == "int" and self.peek()[1] == "[":  # int[s4]: the size symbol it is
                tok = self.peek()
                dims = self.parse_dims()
                if len(dims) != 1 or not isinstance(dims[0], str) or \
                        not is_symbol(dims[0]):
                    raise self.error("an int's size is one size symbol, as in int[s4]", tok)
                return ScalarType(word, size=dims[0])
            return ScalarType(word)
        if word not in DTYPES:
            raise self.error(f"unknown dtype {word!r} (known: {', '.join(DTYPES)})", tok)
        shape = self.parse_dims()
        strides = None
        if self.accept("strided"):
            strides = self.parse_dims()
        device = "cpu"
        if self.peek()[0] == "at":
            device = self.take("at", "a device")[1:]
        return TensorType(shape, word, device, strides)

    def parse_dims(self) -> tuple:
        self.expect("[")
        dims: list = []
        if self.accept("]"):
            return ()
        while True:
            kind, text, _, _ = tok = self.peek()
            self.i += 1
            if kind == "number" and text.lstrip("-").isdigit():
                dims.append(self.int_literal(tok, text))
            elif text == "?":
                dims.append(None)
            elif kind == "ident":
                if not _is_size_symbol(text):  # the printer would quote it, and that fails
                    raise ParseError(f"dim {text!r} is not a size symbol: a symbol is letters, "
                                     f"digits and _ (no dots), neither a Python keyword nor "
                                     f"a size function such as Max", tok[2], tok[3], self.source)
                dims.append(text)
            elif kind == "string":
                dims.append(self.string_literal(tok, text))
                try:  # a size expression: arithmetic over symbols, nothing else
                    parse_dim(dims[-1])
                except SymbolicDimError as exc:
                    self.i -= 1
                    raise self.error(str(exc)) from None
            else:
                self.i -= 1
                raise self.error("expected a dim (int, symbol or ?)")
            if self.accept("]"):
                return tuple(dims)
            self.expect(",")


def _is_size_symbol(text: str) -> bool:
    """Whether a bare dim is one symbol that :func:`parse_dim` reads back as itself."""
    if not is_symbol(text):
        return False
    try:  # keywords (if, True, None) are identifiers but no symbol
        parse_dim(text)
    except SymbolicDimError:
        return False
    return True


def parse_graph(text: str, source: str | None = None) -> Graph:
    """Parse IR text; raises :class:`torchloom.errors.ParseError` with line:column."""
    return _Parser(text, source).parse_graph()


__all__ = ["print_graph", "print_node", "parse_graph", "format_type", "format_attr",
           "format_attrs", "format_dim", "format_graph_name", "DTYPE_NAMES"]
