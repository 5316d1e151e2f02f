"""The public API. Plugins import from here (and ``torchloom``), never from private modules."""

from torchloom import errors
from torchloom.codegen.base import Codegen, Kernel, KernelSource, Reason, compile_group
from torchloom.codegen.eager import EagerCodegen
from torchloom.codegen import indexing
from torchloom.compiler import Compilation, Compiler, default_cache_dir, env_flag
from torchloom.explain import import_workload, load_workload
from torchloom.frontend.fx import import_fx
from torchloom.ir import (DTYPES, Graph, InputRef, Node, ScalarType, TensorType, Type, Value,
                          alpha_equivalent, canonical_text, clone_graph, contiguous_strides,
                          format_type, parse_graph, print_graph, print_node, structural_hash,
                          type_of, verify)
from torchloom.ops.registry import CATEGORIES, OpDef, OpRegistry
from torchloom.passes.base import Deduplication, Pass, PassContext, PassResult
from torchloom.passes.builtin.cse import merge_common_nodes
from torchloom.passes.builtin.dce import remove_dead_nodes
from torchloom.passes.builtin.purity import is_pure, mutated_values
from torchloom.plugins.hookspecs import hookimpl
from torchloom.plugins.loader import load_plugins
from torchloom.progress import Activity, Progress
from torchloom.report import count_kernels, fusion_groups
from torchloom.runtime.cache import KernelCache
from torchloom.ir import symbols
from torchloom.ir.text import format_attrs
from torchloom.ir.provenance import find_instances, mark_decomposition, unmarked_attrs
from torchloom.runtime.executor import CALL_SUBGRAPH, CONSTANT, FUSION_GROUP, build_function

__all__ = [
    "errors", "Codegen", "Kernel", "KernelSource", "Reason", "compile_group", "EagerCodegen", "Compilation", "Compiler", "import_fx",
    "DTYPES", "Graph", "InputRef", "Node", "ScalarType", "TensorType", "Type", "Value",
    "alpha_equivalent", "canonical_text", "clone_graph", "contiguous_strides", "format_type",
    "parse_graph", "print_graph", "print_node", "structural_hash", "type_of", "verify",
    "CATEGORIES", "OpDef", "OpRegistry", "Pass", "PassContext", "PassResult", "Deduplication", "is_pure",
    "mutated_values", "merge_common_nodes", "remove_dead_nodes", "hookimpl", "load_plugins",
    "count_kernels", "fusion_groups",
    "CONSTANT", "FUSION_GROUP", "CALL_SUBGRAPH", "format_attrs", "KernelCache", "build_function",
    "import_workload", "load_workload", "default_cache_dir", "env_flag",
    "mark_decomposition", "find_instances", "unmarked_attrs", "Progress", "Activity", "symbols",
    "indexing",
]
