"""Kernels for groups with symbolic sizes: one source, a variant per launch shape.

A group typed ``f32[s0, s1]`` compiles once, whatever sizes it is later called with. Its
module holds a ``@triton.jit`` function per *variant*, each taking the group's tensors
and then the symbols as scalar arguments ``ks0, ks1, ...`` (sizes.py); masks, coordinates
and strides are computed from them in the kernel:

- a reduction whose row length is symbolic gets a persistent variant (the row in
  registers, ``RBLOCK`` the row length's next power of two, for rows up to the writer's
  ``max_persistent``) and a looped one (``_looped``: chunks of ``RBLOCK``, Welford and
  online softmax) for longer rows; a static row length has its one form, as before;
- a looped reduction whose reductions can be split (split.py) also gets a split variant
  (``_split``: chunk length and count are arguments ``kchunk``/``ksplits``, and a
  ``_finish`` kernel), which a call takes when its rows make fewer row blocks than the
  split form aims for programs;
- a pointwise group with an input laid out across the outputs' walk (tiles.py) also gets
  a tiled variant (``_tiled``, 32-bit only), taken when both tile dims reach
  ``MIN_TILE_DIM`` at the call;
- each of those has a 64-bit twin (``_i64``: program ids and size arguments widened) for
  launches whose elements or offsets reach 2**31.

The launcher (launch.py) evaluates the sizes at each call, picks the variant, and picks
the launch configuration by *size bucket* (the next power of two of the row count and of
the row length, or of the element count), autotuning once per bucket on a GPU. The
metadata's ``configs`` are those of a representative bucket (every size 2**16, the
longest persistent row), which ``explain --target`` builds; ``variants`` lists every
function with what selects it.
"""

from __future__ import annotations

from typing import Any

from torchloom.api import REDUCTION_KINDS, Node, nonempty_dims

from torchloom_codegen_triton.kernel import KernelWriter
from torchloom_codegen_triton.ops import module_prelude


def generate_variants(group: Node, registry: Any, max_persistent: int,
                      first: KernelWriter | None = None) -> tuple[str, dict[str, Any]]:
    """(source, metadata) of a group with symbolic sizes (see the module docstring);
    ``first``: a writer of the group already made (its default form)."""
    first = first or KernelWriter(group, registry, max_persistent, wide=False)
    forms: list[str | None] = [None]
    if first.kind == "reduction" and not isinstance(first.rnumel, int):
        forms = ["persistent", "looped", "split"]
    elif first.kind == "reduction" and first.looped and first.col is None:
        forms = [None, "split"]
    elif first.kind == "pointwise":
        forms = [None, "tiled"]
    functions, variants, finishes = [], [], []
    writers = []
    for wide in (False, True):
        for form in forms:
            if form == "tiled" and wide:
                continue  # tiles index in 32 bits: wide calls walk untiled
            w = KernelWriter(group, registry, max_persistent, form=form, wide=wide)
            if form == "split" and w.split is None or form == "tiled" and w.tiles is None:
                continue  # not split.py's or tiles.py's kind
            suffix = (f"_{form}" if form in ("looped", "split", "tiled") else "") + (
                "_i64" if wide else "")
            kernel, kind, function, finish = w.function(suffix)
            functions.append(function)
            if finish and finish not in finishes:  # row + column: one finishing kernel
                finishes.append(finish)
            writers.append(w)
            meta = w.metadata(kernel, kind)
            variants.append({"kernel": kernel, "form": kind, "wide": wide,
                             "max_rnumel": w.persistent_limit if form == "persistent" else None,
                             "configs": meta["configs"], "split": w.split is not None})
            if w.split is not None:  # its finishing kernel and partials
                variants[-1].update(finish=meta["finish"], scratch=meta["scratch"])
            if w.tiles is not None:  # the dims its tiles span
                variants[-1]["tiles"] = list(w.tiles)
    main = writers[0]
    meta = main.metadata(variants[0]["kernel"], variants[0]["form"])
    meta["symbols"] = [[s, i, k, c] for s, (i, k, c) in first.symbols.items()]
    nonempty = [[d, list(counts), error, message] for d, counts, error, message
                in nonempty_dims(first.region, REDUCTION_KINDS)]
    if nonempty:  # a max over rows of symbolic length: the launch raises on 0, as eager
        meta["nonempty"] = nonempty
    meta["variants"] = variants
    meta["max_persistent"] = max_persistent
    meta["columns"] = bool(first.columns)
    forms_text = " or ".join(dict.fromkeys(v["form"] for v in variants))
    header = main.header(f"{forms_text}, symbolic sizes (variants: "
                         f"{', '.join(v['kernel'] for v in variants)})")
    assert len(finishes) <= 1, "the variants' finishing kernels differ"
    helpers = set().union(*(w.helpers for w in writers))
    source = "\n".join([*header, *module_prelude(helpers), "\n\n\n".join(functions)]) + \
        "\n" + "".join(finishes)
    return source, meta
