"""The printing half of the IR's text form (:mod:`torchloom.ir.text` is the whole form,
parser included). Below :mod:`torchloom.ir.graph`, which prints itself with it, so it never
imports the graph at run time."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

import torch

from torchloom.ir.torch_ops import operator_name
from torchloom.ir.types import DTYPES, InputRef, ScalarType, Type

if TYPE_CHECKING:
    from torchloom.ir.graph import Graph, Node

ENUMS: dict[str, Any] = {
    **{k: v for k, v in DTYPES.items()},
    "contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
    "channels_last_3d": torch.channels_last_3d, "preserve_format": torch.preserve_format,
    "strided": torch.strided, "sparse_coo": torch.sparse_coo,
}
ENUM_NAMES = {v: k for k, v in ENUMS.items()}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def format_dim(d) -> str:
    if d is None:
        return "?"
    if isinstance(d, int):
        return str(d)
    return d if _IDENT.match(d) else json.dumps(d)


_GRAPH_NAME = re.compile(r"[A-Za-z0-9_:.\-]+\Z")


def format_graph_name(name: str) -> str:
    return name if _GRAPH_NAME.match(name) else json.dumps(name)


def format_type(t: Type) -> str:
    if isinstance(t, ScalarType):
        return t.kind if t.size is None else f"{t.kind}[{t.size}]"
    s = f"{t.dtype}[{', '.join(map(format_dim, t.shape))}]"
    if t.strides is not None:
        s += f" strided[{', '.join(map(format_dim, t.strides))}]"
    if t.device != "cpu":
        s += f" @{t.device}"
    return s


def format_attr(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, InputRef):
        return f"${int(v)}"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, torch.device):
        return f"#{v}"
    if isinstance(v, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return f"#op:{operator_name(v)}"  # an operator an op runs (run_with_rng_state's)
    if v in ENUM_NAMES:
        return f"#{ENUM_NAMES[v]}"
    raise TypeError(f"attribute value {v!r} of type {type(v).__name__} has no text form")


def format_attrs(attrs) -> str:
    if not attrs:
        return ""
    return " {" + ", ".join(f"{k} = {format_attr(attrs[k])}" for k in sorted(attrs)) + "}"


def print_node(node: Node, indent: str = "") -> str:
    lhs = ", ".join(f"%{v.name}" for v in node.outputs)
    lhs = f"{lhs} = " if lhs else ""
    types = ", ".join(format_type(v.type) for v in node.outputs) or "()"
    ins = ", ".join(f"%{v.name}" for v in node.inputs)
    text = f"{indent}{lhs}{node.op}({ins}){format_attrs(node.attrs)} : {types}"
    if node.region is not None:
        text += " region " + _print_body(node.region, indent)
    return text


def _print_body(g: Graph, indent: str) -> str:
    params = ", ".join(f"%{v.name}: {format_type(v.type)}" for v in g.inputs)
    lines = [f"@{format_graph_name(g.name)}({params}) {{"]
    for n in g.nodes:
        lines.append(print_node(n, indent + "  "))
    lines.append(f"{indent}  return {', '.join(f'%{v.name}' for v in g.outputs)}".rstrip())
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def print_graph(g: Graph) -> str:
    """The graph, then each shared subgraph as a further ``graph @name(...) {...}`` block."""
    text = "graph " + _print_body(g, "") + "\n"
    for sub in g.subgraphs.values():
        text += "graph " + _print_body(sub, "") + "\n"
    return text
