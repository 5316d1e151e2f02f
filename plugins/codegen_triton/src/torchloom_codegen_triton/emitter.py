"""The line emitter: SSA-style Triton statements with value numbering by source text.

A statement is either "outer" (independent of the reduction index, computed once per row
block) or "inner" (depends on ``rindex``). In the looped form, each reduction is a *phase*:
``for roff in range(0, R, RBLOCK)`` whose body holds the inner statements; outer statements
met while writing a phase go before its loop. In the persistent form there are no loops
and every statement is written once.
"""

from __future__ import annotations

import re

import attrs

from torchloom_codegen_triton.ops import COMPUTE, STORAGE

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LITERAL = re.compile(r"-?\d+(\.\d*)?(e[+-]?\d+)?\Z|float\(\"-?(inf|nan)\"\)\Z|True\Z|False\Z")


@attrs.frozen
class Expr:
    """A value in the kernel: its source text (a name or literal) and compute dtype."""

    text: str
    dtype: str
    rdep: bool = False

    @property
    def is_literal(self) -> bool:
        return bool(_LITERAL.match(self.text))


def par(text: str) -> str:
    return text if _IDENT.fullmatch(text) or _LITERAL.match(text) else f"({text})"


class Emitter:
    """Collects the kernel body; knows which names depend on the reduction index."""

    def __init__(self, looped: bool, hardware_bf16: bool = False):
        self.looped = looped
        #: round to bf16 with the GPU's conversion (round to nearest even, as eager); the
        #: interpreter's conversion truncates, so CPU kernels round in software
        self.hardware_bf16 = hardware_bf16
        #: names holding values already rounded to bf16 -> the f32 value they rounded (a
        #: store converts that value once instead of rounding twice)
        self.bf16_exact: dict[str, str] = {}
        self.lines: list[str] = []
        self.rnames: set[str] = set()
        self.xnames: set[str] = {"xindex"}
        self._memo: dict[str, str] = {}
        self._phase_memo: dict[str, str] = {}
        self._phase: tuple[list[str], list[str]] | None = None
        self._count = 0
        self.phase_id = 0
        #: a split reduction's loops cover one chunk: (start, stop) source text
        self.loop_bounds: tuple[str, str] | None = None

    # ---- statements --------------------------------------------------------------------
    def depends_on_r(self, text: str) -> bool:
        return any(tok in self.rnames for tok in _IDENT.findall(text))

    def depends_on_x(self, text: str) -> bool:
        return any(tok in self.xnames for tok in _IDENT.findall(text))

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}" if hint[-1:].isdigit() else f"{hint}{self._count}"

    def emit(self, text: str, dtype: str, hint: str = "t", rdep: bool | None = None) -> Expr:
        """Bind ``text`` to a name (reusing an earlier identical statement in scope)."""
        rdep = self.depends_on_r(text) if rdep is None else rdep
        if _IDENT.fullmatch(text) or _LITERAL.match(text):
            return Expr(text, dtype, rdep)
        inner = rdep and self.looped
        memo = self._phase_memo if inner else self._memo
        name = memo.get(text)
        if name is None:
            name = self.fresh(hint)
            memo[text] = name
            self.statement(f"{name} = {text}", inner)
            if rdep:
                self.rnames.add(name)
        return Expr(name, dtype, rdep)

    def statement(self, line: str, inner: bool) -> None:
        if self._phase is None:
            self.lines.append(line)
        elif inner:
            self._phase[1].append(line)
        else:
            self._phase[0].append(line)

    # ---- phases (looped form) ------------------------------------------------------------
    def begin_phase(self, rnumel: str, header: list[str]) -> None:
        """Start a loop over the reduction index; ``header`` defines rindex/rmask/r coords."""
        if not self.looped:
            return
        self._phase = ([], [])
        self._phase_memo = {}
        self.phase_id += 1
        start, stop = self.loop_bounds or ("0", str(rnumel))
        self._loop_header = [f"for roff in range({start}, {stop}, RBLOCK):"] + [
            "    " + h for h in header]

    def end_phase(self) -> None:
        if not self.looped or self._phase is None:
            return
        pre, body = self._phase
        self._phase = None
        self.lines.extend(pre)
        self.lines.extend(self._loop_header)
        self.lines.extend("    " + line for line in body)
        self._phase_memo = {}

    # ---- conversions ---------------------------------------------------------------------
    def convert(self, e: Expr, dtype: str) -> Expr:
        """``e`` as compute dtype ``dtype`` (no rounding beyond the target type)."""
        if e.dtype == dtype or (e.is_literal and dtype != "b8"):
            return Expr(e.text, dtype, e.rdep) if e.is_literal else e
        if dtype == "b8":
            return self.emit(f"{par(e.text)} != 0", "b8", "b")
        return self.emit(f"{par(e.text)}.to({STORAGE[dtype]})", dtype, "cvt")

    def cast(self, e: Expr, ir_dtype: str) -> Expr:
        """An explicit cast in the program: rounds to ``ir_dtype`` exactly as eager does."""
        target = COMPUTE[ir_dtype]
        if ir_dtype == "bf16":
            x = self.convert(e, "f32").text
            rounded = self.emit(f"{par(x)}.to(tl.bfloat16).to(tl.float32)" if self.hardware_bf16
                                else f"_round_to_bf16({x})", "f32", "rnd")
            self.bf16_exact[rounded.text] = x
            return rounded
        if ir_dtype != target:  # f16: round, keep computing in f32
            rounded = self.emit(f"{par(e.text)}.to({STORAGE[ir_dtype]})", ir_dtype, "rnd")
            return self.emit(f"{rounded.text}.to({STORAGE[target]})", target, "cvt")
        return self.convert(e, target)
