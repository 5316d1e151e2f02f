"""The cpu codegen's spelling of values (:class:`torchloom.codegen.spelling.Spelling`): C
computing as eager's CPU kernels compute (op_text.py: scalar operands, the cheaper exp of
softmax, ops of one bf16 input read from tables of their results), truth values of a row
combined with a lane's as 32-bit masks, element reads and stores converting and rounding
as eager converts (emitter.py)."""

from __future__ import annotations

from typing import Any

from torchloom.api import Node, expr, spelling

from torchloom_codegen_cpu import op_text
from torchloom_codegen_cpu.emitter import Emitter, Expr, load_element, store_statement
from torchloom_codegen_cpu.ops import literal


class CSpelling(spelling.Spelling):
    """C as the cpu codegen writes it (stateless: what a kernel's module needs besides,
    its result tables, the writer's emitter records)."""

    name = "C"

    def literal(self, value: Any, compute: str) -> expr.Literal:
        return literal(value, compute)

    def op(self, node: Node, spec: Any, named: dict[str, expr.Code], compute: str,
           ir_dtype: str, given: dict[str, Any], em: Emitter) -> expr.Code:
        masks = op_text.lane_masks(node, named, ir_dtype, em.is_inner)
        if masks is not None:  # a truth value of the row with one of the lane
            symbol, outer, inner = masks
            return op_text.combined(symbol, em.emit(outer, "i32", "m", inner=False).code,
                                    inner)
        code, table = op_text.op_text(node, spec, named, compute, ir_dtype, given)
        if table is not None:  # (its results are rounded to ir_dtype)
            em.use_table(*table)
            em.holds_exactly(code.text, ir_dtype)
        return code

    def scalar_operand(self, node: Node, name: str, value: Any) -> Any:
        return op_text.scalar_operand(node, name, value)

    def keeps_operand(self, node: Node, k: int) -> bool:
        return op_text.keeps_operand(node, k)

    def read(self, pointer: str, offset: expr.Code, ir_dtype: str) -> expr.Code:
        return load_element(pointer, offset, ir_dtype)

    def store(self, pointer: str, offset: expr.Code, e: Expr, ir_dtype: str,
              em: Emitter) -> Any:
        return store_statement(pointer, offset, e, ir_dtype, em.unrounded.get(e.text),
                               em.exact.get(e.text))


#: the cpu codegen's spelling (it holds nothing: one for every writer)
C = CSpelling()
