"""The matmuls of a compiled training step get their operands as eager's do (issue 41: the
zoo's Llama step ran its GEMMs slower than Inductor's; counted per call, every ``mm`` and
SDPA call of the step had eager's and Inductor's shapes, strides and dtypes, and no copy
ran outside the kernels). A small Llama (GQA, rotary embeddings, cross entropy) from a
config: every aten call of one step under a ``TorchDispatchMode`` (the compiled one
included: ``ignore_compile_internals``), the compiled step's matmul operands against
eager's, and no ``copy_``/``clone``/``contiguous`` between kernels."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.tools import Compiler

MATMULS = ("mm", "addmm", "bmm", "baddbmm")
COPIES = ("copy_", "clone", "contiguous", "_to_copy")


class Calls(TorchDispatchMode):
    """Every aten call: its name, and for matmuls the layout of each tensor operand."""

    @classmethod
    def ignore_compile_internals(cls):
        return True  # Dynamo runs compiled frames under this mode instead of skipping them

    def __init__(self):
        super().__init__()
        self.names: collections.Counter[str] = collections.Counter()
        self.matmuls: collections.Counter[tuple] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.names[name] += 1
        if name in MATMULS:
            self.matmuls[tuple((tuple(a.shape), a.stride(), a.dtype) for a in args
                               if isinstance(a, torch.Tensor))] += 1
        return func(*args, **(kwargs or {}))


def one_step(model, fn, ids) -> Calls:
    calls = Calls()
    with calls:
        fn(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    return calls


def test_llama_step_matmul_operands_are_eagers_and_nothing_is_copied(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=128, vocab_size=256,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.config.use_cache = False
    ids = torch.randint(1, 256, (1, 64), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torchloom", options={
        "compiler": Compiler("default", cache_dir=tmp_path, compile_cache=False)})
    one_step(model, compiled, ids)  # compiles
    eager, ours = one_step(model, model, ids), one_step(model, compiled, ids)
    # the compiled graphs ran (eager's pointwise ops are in their kernels)
    assert ours.names["mul"] == 0 < eager.names["mul"]
    assert sum(ours.matmuls.values()) == sum(eager.matmuls.values()) > 20
    assert ours.matmuls == eager.matmuls  # shapes, strides and dtypes, call for call
    assert {n: ours.names[n] for n in COPIES if ours.names[n]} == {}
    torch._dynamo.reset()
