"""The indices of a kernel's gathers, checked before its nests run.

A gather (``torchloom.api.GATHER_OPS``: an embedding) reads the table's row its index
names. Eager raises ``IndexError`` for an index outside ``[0, rows)``, a negative one too;
a kernel cannot raise, so its function first reads every index of each input its gathers
read (a loop nest over the input's elements, the innermost a SIMD loop or-ing the
comparisons, made unsigned: a negative index is past the end) and returns 1 where one is
out of range, before it writes anything; the launcher then raises eager's error. The nests
read the tables at indices known to be in range::

    int tl_bad = 0;
    for (int64_t g0 = 0; g0 < 2; g0++) {   /* (a dim of one: no loop, coordinate 0) */
      #pragma omp simd reduction(|:tl_bad)
      for (int64_t g1 = 0; g1 < 16; g1++) {
        tl_bad |= (uint64_t)in_ids[g0 * 16 + g1] >= 100ULL;
      }
    }
    if (tl_bad) {
      return 1;
    }

(Checked in the nest instead, where the index is read, it was a branch in the SIMD row
loop wherever an index varies along the row: T5's position buckets, read for each head.)
"""

from __future__ import annotations

from torchloom.api import Graph, Unsupported, expr, gathered_rows, indexing, stmt

from torchloom_codegen_cpu.emitter import load_element
from torchloom_codegen_cpu.render import Simd
from torchloom_codegen_cpu.tensors import tensor_type

#: the flag the checks set
BAD = "tl_bad"


def index_checks(region: Graph, ix: indexing.IndexMath) -> list:
    """The statements checking every index the gathers of ``region`` read (each against
    the smallest table read at it) and returning 1 on one out of range; none for none."""
    gathered = gathered_rows(region)
    if not gathered:
        return []
    checks: list = [stmt.Var("int", BAD, expr.as_node(0))]
    for ids, rows in gathered.items():
        if ids.producer is not None:
            raise Unsupported(f"the indices %{ids.name} of a gather are computed in the "
                              f"group (the kernel checks them in memory, before it runs)")
        t = tensor_type(ids)
        looped = [k for k, d in enumerate(t.shape) if d != 1]  # (a dim of one: at 0)
        coords = [f"g{k}" if k in looped else "0" for k in range(len(t.shape))]
        offset = ix.address(coords, t.actual_strides(), t.shape)
        index = expr.Op("(uint64_t){0}", expr.POSTFIX,
                        (load_element(f"in_{ids.name}", offset, t.dtype),))
        check: stmt.Statement = stmt.Update(BAD, "|=", expr.Op(
            "{0} >= {1}", expr.LOWEST, (index, expr.Literal(f"{rows}ULL", rows))))
        for k in reversed(looped):
            simd = Simd(((("|", (BAD,)),))) if k == looped[-1] else None
            check = stmt.Loop(coords[k], expr.as_node(0), ix.size_code(t.shape[k]), (check,),
                              annotation=simd)
        checks.append(check)
    checks.append(stmt.If(expr.Name(BAD), (stmt.Raw("return 1;"),)))
    return checks
