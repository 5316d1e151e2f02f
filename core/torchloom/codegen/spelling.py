"""How a target writes a kernel's values: the *spelling* the core's value walk
(:class:`~torchloom.codegen.writer.ValueWalk`) asks a writer for, one object per target.

The walk decides which value is computed where; a :class:`Spelling` says how the target
writes it: a Python number as a constant (:meth:`Spelling.literal`), a pointwise op over
its operands (:meth:`Spelling.op`, which may tell the writer's emitter what the kernel's
module needs besides: a helper, a result table), the target's rules for an op's number
arguments and narrow operands (:meth:`Spelling.scalar_operand`,
:meth:`Spelling.keeps_operand`), and, for a target whose kernels read and write one
element at a time (the core's lowering, the cpu codegen), an element read
(:meth:`Spelling.read`) and an element store (:meth:`Spelling.store`).

:class:`TextSpelling` is the spelling of a :class:`~torchloom.codegen.contract.Renderer`
(its text methods): what the core's lowering writes with (:mod:`torchloom.codegen.lower`),
unless the renderer gives a ``spelling`` of its own (:func:`spelling_of`: expressions as
nodes, the emitter at hand). A native codegen gives its own (the cpu's: C with eager's
rounding rules and SIMD lane masks; Triton's: module helpers)."""

from __future__ import annotations

from typing import Any

from torchloom.codegen import expr, stmt
from torchloom.codegen.contract import Renderer
from torchloom.codegen.expr import Code, Literal
from torchloom.codegen.indexing import Unsupported
from torchloom.codegen.writer import COMPUTE
from torchloom.errors import PluginError
from torchloom.ir import Node


class Spelling:
    """A target's spelling of values (see the module docstring). ``name``: the target, as
    reasons name it (``op ... has no C template``)."""

    name = "target"

    def literal(self, value: Any, compute: str) -> Code:
        """A Python number as a constant of compute dtype ``compute``: a
        :class:`~torchloom.codegen.expr.Literal` (a number a target may let take the type
        it is used at), or an expression where the target must type it (Triton's f64
        constants); TypeError where the target cannot write it."""
        raise NotImplementedError

    def op(self, node: Node, spec: Any, named: dict[str, Code], compute: str,
           ir_dtype: str, given: dict[str, Any], em: Any) -> Code:
        """Pointwise ``node``'s expression: its template ``spec`` (an entry of the
        target's op table) over the operand nodes ``named``, computed in ``compute``, its
        result of IR dtype ``ir_dtype``; the template chosen from ``given`` (the
        attributes, and the arguments that are inputs, as ``InputRef``). ``em``: the
        writer's emitter, told what the kernel's module needs for it."""
        raise NotImplementedError

    def scalar_operand(self, node: Node, name: str, value: Any) -> Any:
        """The value a Python-number argument ``name`` of ``node`` has for the op (eager's
        kernels on some targets convert it to the tensor's type; as given here)."""
        return value

    def keeps_operand(self, node: Node, k: int) -> bool:
        """Whether eager on this target computes ``node`` with input ``k`` as it is though
        the op's type is narrower (none here)."""
        return False

    def read(self, pointer: str, offset: Code, ir_dtype: str) -> Code:
        """Element ``offset`` of the tensor at ``pointer`` (IR dtype ``ir_dtype``) in its
        compute dtype."""
        raise NotImplementedError

    def store(self, pointer: str, offset: Code, e: Any, ir_dtype: str, em: Any) -> Any:
        """The statement writing value ``e`` (a :class:`~torchloom.codegen.writer.Expr`)
        to element ``offset`` of the tensor of IR dtype ``ir_dtype`` at ``pointer``
        (``em``: the writer's emitter, which knows how ``e`` was computed)."""
        raise NotImplementedError


class TextSpelling(Spelling):
    """The spelling of a :class:`Renderer`, from its text methods (``literal``, ``read``,
    ``store_value``) and its op templates (``OpTemplate.text``)."""

    def __init__(self, renderer: Renderer):
        self.renderer = renderer
        self.name = renderer.name

    def literal(self, value: Any, compute: str) -> Literal:
        return Literal(self.renderer.literal(value, compute), value)

    def op(self, node: Node, spec: Any, named: dict[str, Code], compute: str,
           ir_dtype: str, given: dict[str, Any], em: Any) -> Code:
        template = spec.text(given, compute)
        if template is None:
            raise Unsupported(f"{node.op} on {compute} has no {self.name} template")
        try:
            return expr.fill(template, named)
        except KeyError as exc:
            raise Unsupported(f"{node.op}: argument {exc.args[0]} has no value") from None

    def read(self, pointer: str, offset: Code, ir_dtype: str) -> Code:
        return expr.code(self.renderer.read(pointer, offset, ir_dtype))

    def store(self, pointer: str, offset: Code, e: Any, ir_dtype: str, em: Any) -> Any:
        value = self.renderer.store_value(em.convert(e, COMPUTE[ir_dtype]).text, ir_dtype)
        return stmt.Store(stmt.Element(pointer, offset), value)


def spelling_of(renderer: Renderer) -> Spelling:
    """The spelling the lowering writes ``renderer``'s values with: its optional
    ``spelling`` attribute (a :class:`Spelling`, for a renderer that spells some values
    as expression nodes or needs the emitter: a helper of its own, a value bound to a
    name first), else :class:`TextSpelling` of its text methods. ``PluginError`` for a
    ``spelling`` that is no :class:`Spelling`."""
    own = getattr(renderer, "spelling", None)
    if own is None:
        return TextSpelling(renderer)
    if not isinstance(own, Spelling):  # (RendererCodegen asks at once: a load error)
        raise PluginError(f"renderer {renderer.name}: its spelling is a "
                          f"{type(own).__name__}, not a torchloom.api.spelling.Spelling")
    return own
