"""The ``torch.compile`` backend: ``torch.compile(model, backend="torchloom",
options={"pipeline": "default"})``.

Registered in the ``torch_dynamo_backends`` entry-point group, so it works in a fresh
interpreter without importing torchloom first. Forward and backward graphs from
aot_autograd both go through one :class:`~torchloom.compiler.Compiler`.

The forward/backward split is aot_autograd's min-cut rematerialization partitioner by
default, after torchloom's CSE of the joint graph (:mod:`torchloom.frontend.joint_cse`):
what the backward needs is recomputed from the forward's inputs where that moves fewer
bytes than saving it (a layer norm's output is recomputed from x, mean and rstd), with the
norms decomposed before the split so that their pointwise parts can be recomputed.
``partitioner = "default"`` (backend option, or the pipeline's ``[runtime]`` key) keeps
aot_autograd's default partitioner, which saves every intermediate the backward reads. It is also what a graph gets whose groups no codegen but ``eager`` would
take (:func:`runs_on_eager`), and an inference graph (:func:`needs_grad`), unless the
backend option or the pipeline names one: there recomputation and norms split before the
split only add kernels to what eager runs.

A training graph's backward is compiled right after its forward, in the same backend call
(``[runtime] backward = "ahead"``, the default; :mod:`torchloom.compiler.ahead`): its passes
and plan run while the forward's C compiler works, its compiler while the forward runs.
``backward = "lazy"`` (or ``TORCHLOOM_BACKWARD=lazy``) leaves it to aot_autograd's first
``backward()`` call, as Inductor does.

Every graph gets the ``_foreach_*`` ops decomposed one op per tensor
(:mod:`torchloom.frontend.foreach`), and an inference graph keeps its input mutations as
trailing ``copy_`` nodes (``keep_inference_input_mutations``), which the plan turns into
the kernel writing the input where it can (``codegen/buffers.py``): a compiled optimizer
step (``torch.compile(optimizer.step)``) becomes one kernel per parameter (or per group of
small ones) writing the parameter and its states in place.

``mode`` (``torch.compile(..., mode=...)``, or the option ``mode``) is one of
:data:`torchloom.compiler.mode.MODES`: ``reduce-overhead`` turns on CUDA graphs,
``max-autotune`` widens autotuning too. ``pipeline`` may be a dict of a pipeline file's
tables (``{"pipeline": {"codegen": "eager"}, "pass": [{"name": "cse"}]}``). Unknown
option keys and modes are errors with a did-you-mean.

A graph whose inputs include efficient zero tensors (``torch._efficientzerotensor``: no
memory) is handed real zeros in their place (:func:`materializing_zeros`).
"""

from __future__ import annotations

import contextlib
import difflib
import gc
from typing import Any

from torchloom.frontend import conv_layouts, dense_layouts
from torchloom.frontend.addc_ops import restore_addc_ops
from torchloom.compiler.ahead import AheadBackward
from torchloom.compiler.mode import check_mode
from torchloom.errors import PipelineError
from torchloom.passes.pipeline import PARTITIONERS

#: the options of ``torch.compile(backend="torchloom", options=...)`` the README documents
OPTION_KEYS = ("pipeline", "dump_dir", "cache_dir", "compile_cache", "partitioner", "mode",
               "remote_cache", "verify", "channels_last")
#: accepted but not offered to users: ``compiler``, a ready :class:`Compiler` (explain,
#: bench and tests pass one to read its compilations afterwards)
INTERNAL_OPTION_KEYS = ("compiler",)

#: composites decomposed before the forward/backward split, so that the min-cut
#: partitioner can recompute their cheap pointwise parts in the backward
RECOMPUTED_COMPOSITES = ("native_layer_norm", "native_layer_norm_backward",
                         "_fused_rms_norm", "_fused_rms_norm_backward")


def torchloom_backend(gm, example_inputs, options: dict[str, Any] | None = None, mode=None):
    from torch._dynamo.backends.common import aot_autograd

    from torchloom.compiler import Compiler
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTION_KEYS) - set(INTERNAL_OPTION_KEYS))
    if unknown:
        hints = [f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k)
                 for k in unknown for close in [difflib.get_close_matches(k, OPTION_KEYS, n=1)]]
        raise PipelineError(f"torch.compile(backend='torchloom'): unknown option(s) "
                            f"{', '.join(hints)}; known: {', '.join(OPTION_KEYS)}")
    # torch.compile passes mode= or options=, never both: options={"mode": ...} works too
    if mode is not None and options.get("mode") not in (None, mode):
        raise PipelineError(f"torch.compile(backend='torchloom'): mode {mode!r} and option "
                            f"mode {options['mode']!r} disagree")
    mode = check_mode(options.get("mode", mode))
    channels_last = options.get("channels_last", True)
    if not isinstance(channels_last, bool):
        raise PipelineError(f"torch.compile(backend='torchloom'): option channels_last "
                            f"must be True or False, not {channels_last!r}")
    compiler = options.get("compiler") or Compiler(options.get("pipeline", "default"),
                                                  dump_dir=options.get("dump_dir"),
                                                  cache_dir=options.get("cache_dir"),
                                                  compile_cache=options.get("compile_cache"),
                                                  mode=mode,
                                                  remote_cache=options.get("remote_cache"),
                                                  verify=options.get("verify"))

    import torch
    # (compiled autograd traces the backward itself: aot_autograd's would go unused)
    ahead = AheadBackward(lambda gm, inputs, donated: compiler.compile_fx(
        gm, inputs, boxed=True, donated=donated), donated_inputs) \
        if compiler.backward == "ahead" and not torch._dynamo.config.compiled_autograd \
        else None

    def compile_forward(fx_gm, inputs):
        compiled = compiler.compile_fx(fx_gm, inputs, boxed=True)
        if ahead is not None:
            ahead.compile()
        return compiled

    def compile_backward(fx_gm, inputs):
        donated = donated_inputs(inputs)
        compiled = ahead.take(fx_gm, donated) if ahead is not None else None
        if compiled is not None:
            return compiled
        with young_collections():
            return compiler.compile_fx(fx_gm, inputs, boxed=True, donated=donated)

    partitioner = options.get("partitioner") or compiler.pipeline.partitioner
    if partitioner not in PARTITIONERS:
        raise PipelineError(f"torch.compile(backend='torchloom'): partitioner "
                            f"{partitioner!r} must be one of {', '.join(PARTITIONERS)}")
    if not (options.get("partitioner") or compiler.pipeline.partitioner_set) and \
            getattr(compiler, "target", None) is None and (
                not needs_grad(example_inputs) or runs_on_eager(compiler, example_inputs)):
        partitioner = "default"
    # an inference graph's input mutations stay in it (a trailing copy_ the plan can turn
    # into the kernel writing the input: an optimizer step's parameters and states)
    split = split_options(partitioner, compiler.foreach_decompositions)
    # addcdiv and addcmul as eager computes them where Dynamo wrote them out
    # (frontend/addc_ops.py)
    restore_addc_ops(gm)
    # transposed elementwise results traced row-major (frontend/dense_layouts.py)
    dense_layouts.make_dense(gm)
    # convolutional graphs traced channels-last, gradients laid out as eager's
    # (frontend/conv_layouts.py)
    row_major = channels_last and conv_layouts.row_major_convolutions(gm)
    if channels_last and conv_layouts.make_channels_last(gm) and row_major:
        split["partition_fn"] = conv_layouts.gradients_restored(split["partition_fn"],
                                                                example_inputs)
    if ahead is not None:
        split["partition_fn"] = ahead.partitioner(split["partition_fn"])
    with young_collections(), checkpoints_without_backward(gm):
        compiled = aot_autograd(fw_compiler=compile_forward, bw_compiler=compile_backward,
                                keep_inference_input_mutations=True, **split)(gm, example_inputs)
    return materializing_zeros(compiled, example_inputs, boxed=_flattened(gm))


@contextlib.contextmanager
def checkpoints_without_backward(gm):
    """aot_autograd's pass for graphs that compute a loss and its backward in one
    (``remat_using_tags_for_fwd_loss_bwd_graph``) refuses any graph without a joint
    backward whose checkpointed regions draw random numbers: a checkpointed layer with
    dropout called where no input needs a gradient (a frozen model in training mode,
    ``no_grad`` evaluation) fails to compile, with every backend. Such a graph has no
    backward region unless Dynamo traces ``torch.autograd.grad`` (``trace_autograd_ops``)
    or the program annotates one (``phase``); otherwise the pass has nothing to
    rematerialize, and it is off while this graph compiles (the checkpoint then only
    runs its layer once, as eager's does without gradients)."""
    from torch._dynamo import config as dynamo_config
    from torch._functorch import config
    annotated = any(isinstance(n.meta.get("custom"), dict) and "phase" in n.meta["custom"]
                    for n in gm.graph.nodes)
    if dynamo_config.trace_autograd_ops or annotated or \
            not config.remat_using_tags_for_fwd_loss_bwd_graph:
        yield
        return
    with config.patch(remat_using_tags_for_fwd_loss_bwd_graph=False):
        yield


@contextlib.contextmanager
def young_collections():
    """Python's cycle collector, while compiling, traverses only the objects made since
    it began: the process's heap before it (the model, torch's and the user's modules:
    millions of objects, 0.2-0.35 s a full collection in a small Hugging Face model's
    process) is frozen (``gc.freeze``) and unfrozen after, the collector's generations
    as they were. Nothing is frozen where the program froze objects itself (its frozen
    set is its own) or turned the collector off."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _flattened(gm) -> bool:
    """Whether Dynamo flattened the graph's inputs (``GmWrapper``): then aot_autograd's
    function takes them as one list."""
    try:
        from torch._dynamo.utils import GmWrapper
    except ImportError:  # another torch
        return False
    return isinstance(gm, GmWrapper)


def materializing_zeros(compiled, example_inputs, boxed: bool = False):
    """``compiled``, given real zeros where the graph's inputs are efficient zero tensors
    (``torch._efficientzerotensor``, what autograd formulas pass for gradients known to be
    zero): such a tensor has no memory (its data pointer is 0), which eager's kernels know
    by its dispatch key and a compiled kernel would read. Dynamo guards that key, so only
    the graphs compiled for them pay the check. ``boxed``: ``compiled`` takes one list."""
    import torch
    zeros = [i for i, x in enumerate(example_inputs)
             if isinstance(x, torch.Tensor) and x._is_zerotensor()]
    if not zeros:
        return compiled

    def real(args) -> list:
        args = list(args)
        for i in zeros:
            x = args[i]
            if isinstance(x, torch.Tensor) and x._is_zerotensor():
                args[i] = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        return args

    def run_boxed(args: list):
        given = real(args)
        args.clear()  # the caller's list is handed over (aot_autograd frees from it)
        return compiled(given)

    def run(*args):
        return compiled(*real(args))
    return run_boxed if boxed else run


def donated_inputs(example_inputs) -> list[int]:
    """The backward's inputs whose buffers aot_autograd donates (saved activations that
    alias no forward input or output and no gradient: ``bw_donated_idxs``, what Inductor
    reuses; aot_autograd then refuses ``retain_graph=True``), keeping only those that
    cover their whole storage and share it with no other input."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None) if context is not None else None
    indices = getattr(metadata, "bw_donated_idxs", None) or []
    storages: dict[Any, int] = {}
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.layout == torch.strided:
            key = StorageWeakRef(x.untyped_storage())
            storages[key] = storages.get(key, 0) + 1
    donated = []
    for i in indices:
        x = example_inputs[i] if 0 <= i < len(example_inputs) else None
        if (isinstance(x, torch.Tensor) and x.layout == torch.strided
                and x.storage_offset() == 0
                and x.untyped_storage().nbytes() == x.numel() * x.element_size()
                and storages[StorageWeakRef(x.untyped_storage())] == 1):
            donated.append(i)
    return donated


def needs_grad(example_inputs) -> bool:
    """Whether aot_autograd traces a joint graph: grad mode on and some input requiring a
    gradient. An inference graph has no split to plan, so it keeps the default partitioner
    and its norms whole (``fusion.decompose`` splits them, marked, so that groups left to
    eager run the composite again: eager's own results)."""
    import torch
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def runs_on_eager(compiler, example_inputs) -> bool:
    """Whether no codegen of the compiler's chain but ``eager`` takes a group on the
    device of the first tensor input: a one-op group is offered to each of them, with a
    symbolic size when an input has one (dynamic shapes: what the codegens will see)."""
    import torch

    from torchloom.ir.graph import FUSION_GROUP, Graph
    from torchloom.ir.types import TensorType
    device = next((str(x.device) for x in example_inputs if isinstance(x, torch.Tensor)), "cpu")
    symbolic = any(isinstance(x, torch.SymInt) or isinstance(x, torch.Tensor) and not all(
        type(d) is int for d in x.shape) for x in example_inputs)
    t = TensorType(("s0",) if symbolic else (1,), "f32", "cpu" if device == "cpu" else device)
    region = Graph("probe_region")
    region.set_outputs(region.create("aten.neg.default", [region.add_input(t, "x")], [t]).outputs)
    graph = Graph("probe")
    probe = graph.create(FUSION_GROUP, [graph.add_input(t, "x")], [t], region=region)
    chain = compiler.plugins.codegen_chain(compiler.pipeline.codegens or compiler.pipeline.codegen)
    for codegen in chain:
        if codegen.name == "eager":
            continue
        try:
            if codegen.supports(probe, compiler.registry) is None:
                return False
        except Exception:  # a codegen that cannot judge the probe takes nothing here
            continue
    return True


def split_options(partitioner: str, foreach: dict) -> dict[str, Any]:
    """aot_autograd's arguments for ``partitioner`` (see the module docstring). Every
    graph gets ``foreach``, the ``_foreach_*`` ops as one op per tensor
    (:mod:`torchloom.frontend.foreach`: a compiled optimizer step fuses per parameter)."""
    table = foreach
    import torch
    if partitioner == "default":
        from torch._functorch.partitioners import default_partition
        return {"partition_fn": default_partition, "decompositions": table}

    from torchloom.frontend.decompositions import decomposition_table
    ops = [getattr(torch.ops.aten, name) for name in RECOMPUTED_COMPOSITES
           if hasattr(torch.ops.aten, name)]
    return {"partition_fn": cse_then_min_cut,
            "decompositions": {**table, **decomposition_table(ops)}}


def cse_then_min_cut(joint_module, joint_inputs, **kwargs):
    """aot_autograd's min-cut partition of the joint graph, after torchloom's CSE
    (:func:`torchloom.frontend.joint_cse.joint_cse`) in place of the partitioner's own,
    which imports Inductor's lowerings (0.57 s of a first training step; off, like the
    partitioner's, when ``torch._functorch.config.cse`` is not set), and with checkpointed
    dropouts' masks drawn from their shapes (:mod:`torchloom.frontend.checkpointed_dropout`:
    the recomputation then needs no dropout's input)."""
    import torch
    from torch._functorch import config
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.fx._lazy_graph_module import _make_graph_module

    from torchloom.frontend import checkpointed_dropout
    from torchloom.frontend.joint_cse import joint_cse
    graph = None
    if config.cse:
        graph = joint_cse(joint_module.graph)  # a new graph
        graph.eliminate_dead_code()
    if checkpointed_dropout.rewritable(joint_module.graph):
        if graph is None:
            graph = torch.fx.Graph()
            graph.output(graph.graph_copy(joint_module.graph, {}))
        checkpointed_dropout.masks_from_shapes(graph)
    if graph is not None:
        # as aot_autograd makes its modules: lazy (code made on first call) where it is
        joint_module = _make_graph_module(joint_module, graph)
    with config.patch(cse=False):
        return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)
