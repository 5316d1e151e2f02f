"""Row loops that run past the row's end (short odd rows: :func:`row_loops.shaped`).

A row of ``n`` values, ``n`` not a multiple of 8, runs fastest as one loop of whole 8-lane
vectors over ``ceil(n / 8) * 8`` elements with known count: gcc unrolls it and combines
each reduction's lanes once. The lanes past ``n`` must then touch nothing that matters:

- masked loads and stores (``r < n ? ...``) are what C offers, but on this project's KVM
  machines an AVX-512 masked store costs a microcode assist once the kernel has run for a
  few milliseconds (the guest's DAMON clears the pages' accessed bits): a softmax over
  rows of 41 took 0.8 ms, then 2.1 ms, where the blocks-and-tail form took 1.25
  (RESULTS.md, session 18), so no masked store is used;
- instead, where every tensor the loop reads or writes holds its rows end to end in
  memory (dense, the reduced dims innermost), lanes past ``n`` read and write the next
  row's first elements: harmless while that row is the same thread's next one, which
  writes all of its elements afterwards. Accumulators take those lanes' values only where
  ``r < n`` (a select). The last row of each thread's share of rows, whose next row is
  another thread's or past the tensor's end, runs the blocks-and-tail form instead, so
  rows are shared out explicitly (:func:`chunked`, ``x_last``).
"""

from __future__ import annotations

from typing import Any

from torchloom.api import TensorType, stmt

from torchloom_codegen_cpu.render import Pragma

#: the pragma of a nest's loop over rows shared out by OpenMP, and of a parallel region
#: whose threads share the rows out themselves (:func:`chunked`)
PARALLEL_FOR = "#pragma omp parallel for num_threads(nthreads) schedule(static)"
PARALLEL = "#pragma omp parallel num_threads(nthreads)"
#: below this many elements a kernel reading and writing two arrays runs on one thread (a
#: parallel region costs ~µs); one touching k arrays does from ``2 * PARALLEL_MIN / k``
#: elements (the same bytes: an optimizer step's nest reads four and writes three)
PARALLEL_MIN = 32768


def work(numel: int, arrays: int) -> int:
    """A nest's work in element-arrays: its elements times the arrays it touches (at least
    two); threads pay from ``2 * PARALLEL_MIN`` of it (kernel.py and team.py both ask)."""
    return numel * max(arrays, 2)


#: C condition under which a row may run past its end (see the module docstring)
GUARD = "x != x_last"
#: the longest row that runs past its end: through torch.compile, one thread, softmax over
#: rows of 20-55 1.0-1.3x eager where the blocks-and-tail form gave 0.7-1.0x, layer_norm
#: and amax 5-15% faster; from ~56 on the two forms measured alike within noise, and
#: rows of 8k + 7 from 63 on slower (0.85 against 0.91-0.97x eager)
OVERRUN_ROWS = 55


def row_offsets(w: Any) -> dict[str, str] | None:
    """Pointer name -> the C offset of element ``(x, r)`` for each tensor of writer ``w``
    whose rows lie end to end in memory (full shape, dense, reduced dims innermost), or
    None when the nest's rows are not such (symbolic row length, reduced dims elsewhere).
    (``w`` is a ``nest.Writer``, unnamed here: nest.py imports the emitter, which imports
    this module.)"""
    if not isinstance(w.rnumel, int) or w.loop.var != "x" or \
            tuple(w.rdims) != tuple(range(len(w.kept), len(w.shape))):
        return None
    named = [(f"in_{v.name}", v) for v in w.region.inputs if isinstance(v.type, TensorType)]
    named += [*zip(w.out_names, w.outputs), *((name, v) for v, name in w.read_back.items())]
    offsets = {}
    for pointer, v in named:
        t = v.type
        if isinstance(t, TensorType) and tuple(t.shape) == tuple(w.shape) and t.is_dense:
            offsets[pointer] = str(w.ix.address(w.full, t.actual_strides(), t.shape, w.known))
    return offsets


def chunked(bound: str, body: list, parallel: bool, prologue: tuple = (),
            var: str = "x") -> list:
    """The loop over ``var`` (rows ``x``, or staged blocks of rows ``xs``) in ``[0,
    bound)`` (``body``: its statements) with each thread's share explicit (``x_last``: the
    share's last row): in a parallel region (``parallel``), or one thread runs them all;
    ``prologue``: statements each thread runs before its share (rows_and_columns.py: its
    partials)."""
    first, last = f"{var}_first", f"{var}_last"
    loop = stmt.Loop(var, first, f"{last} + 1", tuple(body))
    if not parallel:
        return [stmt.Block((*prologue, stmt.Declare("int64_t", first, "0"),
                            stmt.Declare("int64_t", last, f"{bound} - 1"), loop))]
    return [stmt.Block((*prologue, stmt.Raw(f"int64_t {first}, {last};"),
                        stmt.Raw(f"tl_share({bound}, &{first}, &{last});"), loop),
                       Pragma(PARALLEL))]


#: the prelude's share of rows per thread (contiguous, in thread order, as OpenMP's static
#: schedule, but known to the kernel)
SHARE = """
/* this thread's rows [*first, *last] of n, shared out in contiguous runs */
#ifdef _OPENMP
extern int omp_get_thread_num(void);
extern int omp_get_num_threads(void);
#endif
static inline void tl_share(int64_t n, int64_t* first, int64_t* last) {
#ifdef _OPENMP
  const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
#else
  const int64_t t = 0, k = 1;
#endif
  *first = n * t / k;
  *last = n * (t + 1) / k - 1;
}

/* this thread's number in its parallel region (0 without OpenMP) */
static inline int64_t tl_thread(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
"""
