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
- cos is ``tl_m_cos`` (a macro): gcc combines a builtin sin and cos of one argument into a
  scalar ``sincos`` call before it vectorizes (a rotary embedding's loop was scalar glibc
  sincosf). A loop with both a branch and a cos is not vectorized.
- f32 cos is ``(float)tl_m_cos((double)x)``: the f32 variant misses the correctly rounded
  value in a fifth of tiny arguments (cos(3.4e-6) is 1 - 2^-24 where eager gives 1), which
  the cancellation in sinc's gradient, ``(cos(pi x) pi x - sin(pi x)) / (pi x^2)``, made 0.057
  where eager's is 0 (OpInfo's sinc samples). The double variant rounded to f32 was
  correctly rounded on a million arguments, every function; but an f32 loop through double
  runs at half the speed or less (sin 0.18 -> 0.47 ms a million elements, softplus and pow
  then slower than eager), so the other functions keep their f32 variants (within 4 ulp,
  sin and tan of tiny arguments correctly rounded).

The scalar form and the clone are two instructions of assembly each (a broadcast and a
jump; the variant's lane 0 is in the scalar's return register): as C they cost 30 ms of
every build. Every library so names every variant: the toolchain's probe loads the block,
and a glibc without one of them (before 2.35: tan, erf, log1p, ...) builds with libm's
scalar functions (one value everywhere, slower). pow, atan2 and hypot take two arguments
(``vv`` variants): the scalar form broadcasts both. clang maps libm's calls itself
(``-fveclib=libmvec``): there the block only declares them ``simd``, and values computed in
two loops may still differ.
"""

from __future__ import annotations

import functools

#: the libm functions with libmvec variants the kernels call
VECTOR_MATH = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
               "tanh", "erf", "erfc", "sinh", "cosh", "asinh", "acosh", "atanh", "asin",
               "acos", "atan", "pow", "atan2", "hypot")
#: those of two arguments (libmvec's ``vv`` variants)
_BINARY = frozenset({"pow", "atan2", "hypot"})
#: those called under their own names (cos through a macro: no sincos)
_BUILTINS = frozenset(VECTOR_MATH) - {"cos"}
#: those whose f32 form is the double variant's value rounded (an f32 loop through double
#: runs at half the speed: only where the f32 variant's error was seen; the docstring)
_THROUGH_DOUBLE = frozenset({"cos"})
assert not _THROUGH_DOUBLE & _BINARY  # (its macro takes one argument)

#: per x86-64 ISA level (the widest the compiler targets first): its macro, glibc's ISA
#: letter, the vector's bytes and per C type (D: double, F: float) the instruction that
#: broadcasts scalar argument ``r`` (in xmm<r>) to the variant's vector
_ISAS = (("__AVX512F__", "e", 64, {"D": "vbroadcastsd %xmm{r}, %zmm{r}",
                                   "F": "vbroadcastss %xmm{r}, %zmm{r}"}),
         ("__AVX2__", "d", 32, {"D": "vbroadcastsd %xmm{r}, %ymm{r}",
                                "F": "vbroadcastss %xmm{r}, %ymm{r}"}),
         ("__SSE2__", "b", 16, {"D": "unpcklpd %xmm{r}, %xmm{r}",
                                "F": "shufps $0, %xmm{r}, %xmm{r}"}))
_CTYPES = {"D": ("double", "", 8), "F": ("float", "f", 4)}

_GCC = "defined(TL_LIBMVEC) && defined(__x86_64__) && defined(_OPENMP)"


def _label(name: str) -> str:
    """A hidden function's label (``name``: C string literals), as C string literals."""
    return (f'".globl " {name} "\\n.hidden " {name} "\\n.type " {name} ", @function\\n" '
            f'{name} ":\\n"')


def _one_variant(fn: str, kind: str) -> list[str]:
    """``fn``'s lines for a C type (``kind``: D or F): the declaration the kernels call
    (libm's own name or ``tl_m_``'s, declared simd, symbol ``tl_m_``'s), and that symbol's
    scalar form and clone in assembly: the scalar form broadcasts its argument and jumps
    to the variant, the clone jumps to it. ``.pushsection``: gcc keeps track of the section
    it is in."""
    ctype, suffix, _ = _CTYPES[kind]
    name, arity = f"{fn}{suffix}", 2 if fn in _BINARY else 1
    called = name if fn in _BUILTINS else f"tl_m_{name}"
    clone, params = f"TL_M_{kind}CLONE{arity}", ", ".join([ctype] * arity)
    jump = f'"  jmp " {clone} "{name}@PLT\\n"'
    return [f"#pragma omp declare simd notinbranch simdlen(TL_M_{kind}LANES)",
            f'extern {ctype} {called}({params}) __asm__("tl_m_{name}") '
            f"__attribute__((const, nothrow, leaf));",
            f'__asm__(".pushsection .text\\n" {_label(chr(34) + "tl_m_" + name + chr(34))}',
            f"        TL_M_{kind}BROADCAST{arity} {jump}",
            f'        {_label(f"{clone} {chr(34)}tl_m_{name}{chr(34)}")}',
            f'        {jump} ".popsection\\n");',
            *([] if fn in _BUILTINS else [f"#define {name}(x) tl_m_{name}(x)"])]


@functools.cache
def declarations() -> str:
    """The block (after ``math.h``): used when the toolchain defines ``TL_LIBMVEC`` (it
    links ``-lmvec``), so the source does not depend on the machine. Built once: the
    prelude, which starts with it, is asked for by every kernel (0.09 ms a build)."""
    lines = [f"#if {_GCC} && !defined(__clang__)"]
    for k, (macro, isa, width, broadcast) in enumerate(_ISAS):
        lines.append(f"#{'el' if k else ''}if defined({macro})")
        for kind, (_, _, size) in _CTYPES.items():
            lanes = width // size
            bcast = [f"  {broadcast[kind].format(r=r)}\\n" for r in range(2)]
            lines += [f'#define TL_M_{kind}CLONE1 "_ZGV{isa}N{lanes}v_"',
                      f'#define TL_M_{kind}CLONE2 "_ZGV{isa}N{lanes}vv_"',
                      f"#define TL_M_{kind}LANES {lanes}",
                      f'#define TL_M_{kind}BROADCAST1 "{bcast[0]}"',
                      f'#define TL_M_{kind}BROADCAST2 "{bcast[0]}" "{bcast[1]}"']
    lines.append("#endif")
    for fn in VECTOR_MATH:
        lines += _one_variant(fn, "D") + (
            _one_variant(fn, "F") if fn not in _THROUGH_DOUBLE else
            [f"#define {fn}f(x) ((float){fn if fn in _BUILTINS else 'tl_m_' + fn}"
             f"((double)(x)))"])
    lines.append(f"#elif {_GCC}")
    for fn in VECTOR_MATH:
        floats, doubles = (", ".join([t] * (2 if fn in _BINARY else 1))
                           for t in ("float", "double"))
        lines += ["#pragma omp declare simd notinbranch", f"extern float {fn}f({floats});",
                  "#pragma omp declare simd notinbranch", f"extern double {fn}({doubles});"]
    lines.append("#endif")
    return "\n".join(lines) + "\n"
