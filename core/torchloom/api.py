"""The plugin author's surface: what a plugin may import of the core (and all it may).

- the IR: :class:`Graph`, :class:`Node`, :class:`Value` (with their edit API), region
  surgery (:class:`RegionEditor`: wrap, absorb, merge; adding, removing and reordering a
  region node's inputs and outputs), types, the text form, the
  structural hash, the verifier, size expressions (``symbols``) and the IR's own ops
  (``FUSION_GROUP``, ``CALL_SUBGRAPH``, ``CONSTANT``); FX import (``import_fx``) and torch's
  decomposition table with eager's CPU arithmetic where it differs (``decomposition_table``);
- the op registry: :class:`OpDef`, :class:`OpRegistry`;
- passes: :class:`Pass`, :class:`PassContext`, :class:`PassResult` (with
  :class:`Deduplication`) and the built-in passes' helpers a pass may reuse; passes by
  example (:func:`pattern_pass`, :class:`Rewrite`, :class:`Match`, :class:`PatternPass`)
  and liveness that counts graph outputs (:func:`is_dead`, :func:`readers`,
  :func:`dead_nodes`, :class:`GraphOutput`);
- :data:`hookimpl`, to register passes, ops, codegens, runtime wrappers, instruments;
- the codegen protocol: :class:`Codegen`, :class:`Kernel`, :class:`KernelSource`,
  :class:`Reason`, :class:`ArtifactStore` (built artifacts shared by a fleet),
  :class:`Written` (a kernel written while judging, kept for ``generate``), and
  ``indexing`` (index math over symbolic sizes) and ``reductions`` (the reduction
  ops' table, :func:`~torchloom.codegen.reductions.reduction_table`), ``schedule`` (the
  target-independent kernel schedule: :class:`~torchloom.codegen.schedule.ReductionNest`),
  ``nests`` (the schedule's nest plan: which loop nests a kernel runs, what each stores,
  computes and reads back, :func:`~torchloom.codegen.nests.plan`), ``columns`` (a
  reduction nest's column form: :func:`~torchloom.codegen.columns.plan`; ``column_nest``,
  its walks written once for every target),
  ``stmt`` (the structured statement IR writers build and transform before rendering),
  ``expr`` (expressions as nodes: names, literals, ops with their precedence) and
  ``writer`` (what native kernel writers share: the value walk, numbered statements,
  op tables), ``spelling`` (how a target writes values, the value walk's hooks:
  :class:`~torchloom.codegen.spelling.Spelling`), ``nest_writer`` (the writer of one
  nest element by element, the cpu's and the lowering's base:
  :class:`~torchloom.codegen.nest_writer.NestWriter`) and ``op_rows`` (pointwise rows
  every target spells alike: ``OpRow``, ``alpha_rows``, ``clamp_rows``, ``comparisons``);
- the codegen contract a renderer implements (docs/writing-a-codegen.md): ``contract``
  (:class:`Schedule`, :class:`Capabilities`, :class:`Renderer`, :class:`OpTemplate`,
  :class:`LaunchSpec` and its :class:`Bound`, :class:`Lowered`, :class:`Param`,
  :func:`size_param`, :data:`FORMS`, :data:`REDUCTION_KINDS`), the pointwise walk
  (:class:`Walk`; ``walk_nest``, its loops written once for every target; ``row_form``,
  a reduction nest's row written once alike) and the 2-D tile plan (:class:`Tiles`;
  ``tiles``, with the transform putting a walk's rows in tiles,
  :func:`~torchloom.codegen.tiles.tile_rows`), and
  ``lower`` (the lowering to statements, :class:`RendererCodegen`),
  :class:`Unsupported`; the empty-row checks
  every launcher makes (:func:`nonempty_dims`, :func:`check_source`); a codegen's check
  that eager raises for a group (:func:`rejected_by_eager`);
- ``errors``, the cache directory and environment switches, progress reporting.

Importing it loads no compiler, runtime, explain or report module. Tools built on the
compiler (``Compiler``, workloads, kernel counts) are in :mod:`torchloom.tools`.
"""

from torchloom import errors
from torchloom.codegen import (column_nest, columns, contract, expr, indexing, lower, nests,
                               nest_writer, op_rows, reductions, row_form, row_forms, schedule,
                               spelling, stmt, tiles, walk_nest, writer)
from torchloom.codegen.contract import (FORMS, REDUCTION_KINDS, Bound, Capabilities,
                                        LaunchSpec, Lowered, OpTemplate, Param, Renderer,
                                        Schedule, size_param)
from torchloom.codegen.empty_rows import check_source, nonempty_dims
from torchloom.codegen.int_sizes import int_sizes, unread_inputs
from torchloom.codegen.indexing import Unsupported
from torchloom.codegen.tiles import Tiles
from torchloom.codegen.walks import Walk
from torchloom.codegen.gathers import GATHER_OPS, gathered_rows, input_read_bytes
from torchloom.codegen.lower import RendererCodegen
from torchloom.codegen.base import (ArtifactStore, Codegen, Kernel, KernelSource, Reason,
                                    Written, laid_out_as, rejected_by_eager, same_strides)
from torchloom.environment import default_cache_dir, env_flag
from torchloom.frontend.decompositions import decomposition_table, pad_fill
from torchloom.frontend.fx import import_fx
from torchloom.frontend.patterns import Rewrite, pattern_pass
from torchloom.ir import (DTYPES, Graph, InputRef, Node, ScalarType, TensorType, Value,
                          canonical_text, clone_graph, format_type, parse_graph, print_graph,
                          attrs_key, structural_hash, symbols, verify)
from torchloom.ir.graph import CALL_SUBGRAPH, CONSTANT, FUSION_GROUP
from torchloom.ir.liveness import GraphOutput, dead_nodes, is_dead, readers
from torchloom.ir.provenance import mark_decomposition, unmarked_attrs
from torchloom.ir.regions import (RegionEditor, add_region_input, add_subgraph_input,
                                  remove_region_input, select_region_inputs,
                                  select_region_outputs, subgraph_calls)
from torchloom.ir.text import format_attrs
from torchloom.ops.registry import OpDef, OpRegistry, eager_rejects
from torchloom.passes.base import Deduplication, Pass, PassContext, PassResult
from torchloom.passes.builtin.cse import merge_common_nodes
from torchloom.passes.builtin.dce import remove_dead_nodes
from torchloom.passes.builtin.purity import mutated_values
from torchloom.passes.pattern import Match, PatternPass
from torchloom.plugins.hookspecs import hookimpl
from torchloom.progress import Activity, Progress

__all__ = [
    "errors",
    # the IR
    "DTYPES", "Graph", "InputRef", "Node", "ScalarType", "TensorType", "Value",
    "CALL_SUBGRAPH", "CONSTANT", "FUSION_GROUP", "attrs_key", "canonical_text", "clone_graph",
    "decomposition_table", "pad_fill", "format_attrs", "format_type", "import_fx",
    "mark_decomposition", "parse_graph", "print_graph", "structural_hash", "symbols",
    "unmarked_attrs", "verify",
    # region surgery
    "RegionEditor", "add_region_input", "add_subgraph_input", "remove_region_input",
    "select_region_inputs", "select_region_outputs", "subgraph_calls",
    # the op registry
    "OpDef", "OpRegistry", "eager_rejects",
    # passes
    "Deduplication", "Pass", "PassContext", "PassResult", "merge_common_nodes",
    "mutated_values", "remove_dead_nodes",
    # passes by example, and liveness that counts graph outputs
    "Match", "PatternPass", "Rewrite", "pattern_pass", "GraphOutput", "dead_nodes", "is_dead",
    "readers",
    # hooks
    "hookimpl",
    # codegens
    "ArtifactStore", "Codegen", "Kernel", "KernelSource", "Reason", "Written", "expr",
    "laid_out_as", "same_strides", "rejected_by_eager",
    "columns", "indexing", "nests", "op_rows", "reductions", "row_forms", "schedule", "stmt",
    "tiles", "walk_nest", "row_form", "column_nest", "writer", "spelling", "nest_writer",
    # the codegen contract
    "FORMS", "REDUCTION_KINDS", "Bound", "Capabilities", "LaunchSpec", "Lowered",
    "OpTemplate", "Param", "Renderer", "RendererCodegen", "Schedule", "Unsupported",
    "contract", "lower", "check_source", "nonempty_dims", "int_sizes", "unread_inputs",
    "size_param", "Tiles", "Walk", "GATHER_OPS", "gathered_rows", "input_read_bytes",
    # the environment
    "Activity", "Progress", "default_cache_dir", "env_flag",
]
