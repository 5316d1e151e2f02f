"""libmvec in the kernels: one variant per function, at every lane count.

glibc's libmvec has SIMD variants of libm's transcendentals (``_ZGVeN16v_sinf``: AVX-512,
16 floats). ``math.h`` declares them only under ``-ffast-math``, which would break NaN and
inf propagation, so the prelude declares them itself. A variant and the scalar function
round differently (a quarter of the f32 values of a million arguments, two thirds of the
f64 ones for sin), as do the AVX2 and AVX-512 variants of one function; and gcc decides per
loop which elements take which (a 16-lane body, an 8-lane epilogue, a scalar peeled or
versioned copy). A value computed in two loops or two kernels then differed: ``h ==
h.amax(0)`` found no maximum in a column, and amax's gradient divided by a count of 0
(NaN).

So with gcc on x86-64 every function ``f`` of :data:`VECTOR_MATH` has one variant, of the
widest ISA the compiler targets, and one symbol ``tl_m_f`` (``tl_m_ff`` for f32): declared
``omp declare simd`` with that variant's lanes, its vector clone is the variant and its
scalar form is lane 0 of the variant on a broadcast. A variant's lane depends on its own
argument alone (measured on glibc 2.36's AVX-512 variants, every function: 1.6 million
f64 and 3.2 million f32 lanes beside NaN, infinite, huge and subnormal neighbours), so
every loop gives an element one value.

- Most functions keep libm's name, redeclared with ``__asm__("tl_m_f")``: gcc still knows
  them as its builtins, and if-converts a loop whose conditional calls one (gcc 12
  vectorizes no loop with both a branch and a call it does not know).
- sin and cos are ``tl_m_sin``/``tl_m_cos`` (macros): gcc combines a builtin sin and cos of
  one argument into a scalar ``sincos`` call before it vectorizes (a rotary embedding's
  loop was scalar glibc sincosf). A loop with a branch and a sin or cos is not vectorized.

clang maps libm's calls itself (``-fveclib=libmvec``): there the block only declares them
``simd``, and values computed in two loops may still differ.
"""

from __future__ import annotations

#: the libm functions with libmvec variants the kernels call
VECTOR_MATH = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
               "tanh", "erf")
#: those called under their own names (the rest through macros: sincos)
_BUILTINS = frozenset(VECTOR_MATH) - {"sin", "cos"}

#: per x86-64 ISA level (the widest the compiler targets first): its macro, glibc's ISA
#: letter and per C type (D: double, F: float) the lanes, the vector type, a broadcast
#: and lane 0
_ISAS = (("__AVX512F__", "e", {"D": (8, "__m512d", "_mm512_set1_pd", "_mm512_cvtsd_f64"),
                               "F": (16, "__m512", "_mm512_set1_ps", "_mm512_cvtss_f32")}),
         ("__AVX2__", "d", {"D": (4, "__m256d", "_mm256_set1_pd", "_mm256_cvtsd_f64"),
                            "F": (8, "__m256", "_mm256_set1_ps", "_mm256_cvtss_f32")}),
         ("__SSE2__", "b", {"D": (2, "__m128d", "_mm_set1_pd", "_mm_cvtsd_f64"),
                            "F": (4, "__m128", "_mm_set1_ps", "_mm_cvtss_f32")}))
_CTYPES = {"D": ("double", ""), "F": ("float", "f")}
_HIDDEN = '__attribute__((visibility("hidden")))'

_GCC = "defined(TL_LIBMVEC) && defined(__x86_64__) && defined(_OPENMP)"


def _one_variant(fn: str, kind: str) -> list[str]:
    """``fn``'s lines for a C type (``kind``: D or F): libmvec's variant, the declaration
    the kernels call (libm's own name or ``tl_m_``'s, declared simd), and ``tl_m_``'s
    scalar form and clone, defined under their symbols (so gcc makes no clone of its
    own)."""
    ctype, suffix = _CTYPES[kind]
    name, vec = f"{fn}{suffix}", f"tl_m_{kind}vec"
    called = name if fn in _BUILTINS else f"tl_m_{name}"
    return [f"extern {vec} TL_M_{kind}VARIANT({name})({vec});",
            f"#pragma omp declare simd notinbranch simdlen(TL_M_{kind}LANES)",
            f'extern {ctype} {called}({ctype}) __asm__("tl_m_{name}") '
            f"__attribute__((const, nothrow, leaf));",
            f'{ctype} tl_m_{name}_one({ctype}) __asm__("tl_m_{name}");',
            f"{_HIDDEN} {ctype} tl_m_{name}_one({ctype} x) {{ return TL_M_{kind}ONE({name}, x); }}",
            f"{_HIDDEN} {vec} TL_M_{kind}VARIANT(tl_m_{name})({vec} x) "
            f"{{ return TL_M_{kind}VARIANT({name})(x); }}",
            *([] if fn in _BUILTINS else [f"#define {name}(x) tl_m_{name}(x)"])]


def declarations() -> str:
    """The block (after ``math.h``): used when the toolchain defines ``TL_LIBMVEC`` (it
    links ``-lmvec``), so the source does not depend on the machine."""
    lines = [f"#if {_GCC} && !defined(__clang__)", "#include <immintrin.h>"]
    for k, (macro, isa, kinds) in enumerate(_ISAS):
        lines.append(f"#{'el' if k else ''}if defined({macro})")
        for kind, (lanes, vec, set1, lane0) in kinds.items():
            lines += [f"#define TL_M_{kind}VARIANT(f) _ZGV{isa}N{lanes}v_##f",
                      f"#define TL_M_{kind}LANES {lanes}", f"typedef {vec} tl_m_{kind}vec;",
                      f"#define TL_M_{kind}ONE(f, x) {lane0}(TL_M_{kind}VARIANT(f)({set1}(x)))"]
    lines.append("#endif")
    for fn in VECTOR_MATH:
        lines += _one_variant(fn, "D") + _one_variant(fn, "F")
    lines.append(f"#elif {_GCC}")
    for fn in VECTOR_MATH:
        lines += ["#pragma omp declare simd notinbranch", f"extern float {fn}f(float);",
                  "#pragma omp declare simd notinbranch", f"extern double {fn}(double);"]
    lines.append("#endif")
    return "\n".join(lines) + "\n"
