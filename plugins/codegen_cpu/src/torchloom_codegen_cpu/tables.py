"""Result tables: an expensive unary op of a bf16 value read from its 65,536 results.

A bf16 value has 65,536 bit patterns, so ``gelu`` of a bf16 tensor into bf16 has only that
many results. Where the op's input and result are both bf16, the kernel reads
the result from a table filled once when the library loads, by the very C expression the
kernel would otherwise compute per element, rounded as eager rounds the op's result. So a
table changes no value: element for element it gives what the computed form gives (the
fill loop is a ``#pragma omp simd`` loop like the kernels', calling the same functions).

What it changes is the time: on an AVX-512 CPU gcc reads 16 table entries with one gather,
so bias + GELU in bf16 (2048 x 3072, one thread, Intel Xeon) went from 4.0 to 2.2 ms, bf16
exp from 3.1 to 1.6 ms. Without vector gathers (AVX2 tuning, clang without them, another
ISA) the lookups would be scalar, slower than computing, so the tables are used only where
the toolchain probe found the compiler vectorizes a table read (``TL_TABLES``, see
toolchain.py); elsewhere the same source computes the op. f16 has no tables: with the
index from ``_Float16`` conversions gcc 12 did not vectorize the read (a 2048 x 3072 f16
log took 60 ms); f16 conversions have since become bit arithmetic under gcc (prelude.py),
with which f16 tables were not tried.

Each table is one block of the source, guarded by a macro so a translation unit holding
several kernels that use it defines it once; the kernel calls ``tl_t<key>(x)``, which
either way gives the result rounded to bf16 (the emitter then neither rounds it again nor
converts it on a store: its bits are the element's).
"""

from __future__ import annotations

import hashlib

#: unary float ops worth a table lookup (a gather costs about what a copy does; these cost
#: several times that computed); their other arguments, if any, are constants in the text
TABULATED = frozenset(f"aten.{name}.default" for name in (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh",
    "erf", "sigmoid", "silu", "gelu"))

#: tabulated dtype -> (bits -> f32 value, f32 value -> rounded f32, f32 value -> bits)
_CONVERSIONS = {"bf16": ("tl_bf16_to_f32", "tl_round_bf16", "tl_bits_bf16")}


def table(op: str, expression: str, dtype: str) -> tuple[str, str] | None:
    """(definition, function name) of the table of ``op`` on ``dtype``, whose f32 result
    for an input ``x`` is the C text ``expression``; None when ``op`` is not tabulated or
    ``dtype`` is not bf16."""
    if op not in TABULATED or dtype not in _CONVERSIONS:
        return None
    widen, rounded, bits = _CONVERSIONS[dtype]
    key = hashlib.sha256(f"{dtype}\0{expression}".encode()).hexdigest()[:12]
    name = f"tl_t{key}"
    definition = f"""\
#ifndef TL_TABLE_{key}
#define TL_TABLE_{key}
/* {op} of {dtype}: from a table of its 65,536 results where TL_TABLES (see tables.py) */
static inline float {name}_f(float x) {{ return {expression}; }}
#if TL_TABLES
static float {name}_table[65536];
__attribute__((constructor)) static void {name}_fill(void) {{
  #pragma omp simd
  for (int32_t i = 0; i < 65536; i++)
    {name}_table[i] = {rounded}({name}_f({widen}((uint16_t)i)));
}}
#define {name}(x) ({name}_table[{bits}(x)])
#else
#define {name}(x) {rounded}({name}_f(x))
#endif
#endif
"""
    return definition, name
