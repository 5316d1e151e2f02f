"""The graph IR: values, nodes, graphs, types, text form, verification and hashing."""

from torchloom.ir.canon import alpha_equivalent, canonical_text, structural_hash
from torchloom.ir.graph import Graph, InputRef, Node, Value, clone_graph
from torchloom.ir.text import format_type, parse_graph, print_graph, print_node
from torchloom.ir.types import (DTYPES, ScalarType, TensorType, Type, attrs_key, contiguous_strides,
                                float_key, type_of)
from torchloom.ir.verify import verify

__all__ = ["Graph", "Node", "Value", "InputRef", "clone_graph", "TensorType", "ScalarType",
           "Type", "DTYPES", "contiguous_strides", "type_of", "parse_graph", "print_graph",
           "print_node", "format_type", "verify", "canonical_text", "structural_hash",
           "alpha_equivalent", "attrs_key", "float_key"]
