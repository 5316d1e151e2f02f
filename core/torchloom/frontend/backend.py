"""The ``torch.compile`` backend: ``torch.compile(model, backend="torchloom",
options={"pipeline": "default"})``.

Registered in the ``torch_dynamo_backends`` entry-point group, so it works in a fresh
interpreter without importing torchloom first. Forward and backward graphs from
aot_autograd both go through one :class:`~torchloom.compiler.Compiler`.
"""

from __future__ import annotations

from typing import Any

from torchloom.errors import PipelineError

OPTION_KEYS = ("pipeline", "dump_dir", "cache_dir", "compile_cache", "compiler")


def torchloom_backend(gm, example_inputs, options: dict[str, Any] | None = None, mode=None):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from torchloom.compiler import Compiler
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise PipelineError(f"torch.compile(backend='torchloom'): unknown option(s) "
                            f"{', '.join(unknown)}; known: {', '.join(OPTION_KEYS)}")
    compiler = options.get("compiler") or Compiler(options.get("pipeline", "default"),
                                                  dump_dir=options.get("dump_dir"),
                                                  cache_dir=options.get("cache_dir"),
                                                  compile_cache=options.get("compile_cache"))

    def compile_one(fx_gm, inputs):
        return make_boxed_func(compiler.compile_fx(fx_gm, inputs))

    return aot_autograd(fw_compiler=compile_one, bw_compiler=compile_one)(gm, example_inputs)
