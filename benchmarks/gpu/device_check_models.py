"""The model-level parts of ``device_check.py`` (the slow ones, run last): the compile time
of examples/transformer_stack.py at 12 layers against 1 layer (the first training step,
each in a fresh process with empty caches), and a training step of two Hugging Face
models built from configs (GPT-2, Llama; nothing is downloaded), eager against Inductor
and torchloom.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from device_check_common import Part, Row, compile_variant, interleaved, matches, wall_us
from device_check_parts import EXAMPLES, example

# --- compile time: 12 layers against 1 ----------------------------------------------

#: one first training step (torch.compile, forward, backward) in a fresh interpreter;
#: prints JSON. argv: backend, layers, example file.
FIRST_STEP = """
import json, sys, time
import torch
from torchloom.tools import Compiler, import_workload
backend, layers, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model, (x,) = import_workload(path).workload(device="cuda", layers=layers)
compiler = None
if backend == "torchloom":
    compiler = Compiler("default")
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler})
else:  # "inductor", or "aot_eager": Dynamo and aot_autograd alone
    compiled = torch.compile(model, backend=backend)
torch.cuda.synchronize()
t0 = time.perf_counter()
out = compiled(x)
out.sum().backward()
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
try:
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    match = "yes"
except AssertionError as exc:
    match = "NO: " + str(exc).strip().splitlines()[0]
own = sum(c.compile_seconds for c in compiler.compilations) if compiler else None
fallbacks = [c.fallback_reason for c in compiler.compilations
             if c.fallback_reason] if compiler else []
print(json.dumps({"seconds": seconds, "own_compile_s": own, "match": match,
                  "fallbacks": fallbacks[:2]}))
"""


def _first_step(backend: str, layers: int, timeout: float) -> dict:
    """The first training step in a fresh process with empty Triton, Inductor and
    torchloom caches."""
    with tempfile.TemporaryDirectory(prefix="device-check-compile-") as work:
        env = dict(os.environ, TRITON_CACHE_DIR=f"{work}/triton",
                   TORCHINDUCTOR_CACHE_DIR=f"{work}/inductor", TORCHLOOM_CACHE_DIR=work)
        done = subprocess.run([sys.executable, "-c", FIRST_STEP, backend, str(layers),
                               str(EXAMPLES / "transformer_stack.py")],
                              capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        tail = [ln for ln in done.stderr.strip().splitlines() if ln.strip()][-3:]
        raise RuntimeError(f"{backend} {layers} layer(s) exited {done.returncode}: "
                           + " / ".join(tail))
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure_compile(ctx, backend: str) -> dict:
    runs = {}
    for layers in (1, 12):
        left = ctx.deadline - time.time()
        if left < 5:
            raise TimeoutError(f"part budget spent before the {layers}-layer step")
        runs[layers] = _first_step(backend, layers, timeout=left)
    own = [runs[n]["own_compile_s"] for n in (1, 12)]
    return {"first_step_1_s": runs[1]["seconds"], "first_step_12_s": runs[12]["seconds"],
            "ratio_12_over_1": runs[12]["seconds"] / runs[1]["seconds"],
            "own_compile_1_s": own[0], "own_compile_12_s": own[1],
            "own_ratio_12_over_1": own[1] / own[0] if own[0] else None,
            "match": "yes" if all(r["match"] == "yes" for r in runs.values())
            else "; ".join(r["match"] for r in runs.values()),
            "notes": runs[1]["fallbacks"] + runs[12]["fallbacks"]}


def _smoke_stack(built):
    compile(FIRST_STEP, "<first_step>", "exec")  # the child script still parses
    for layers in (1, 12):
        model, [x] = example("transformer_stack").workload(device="cpu", layers=layers)
        model(x).sum().backward()


COMPILE_TIME = Part(
    "compile_time", "examples/transformer_stack.py, 12 layers against 1: the first training "
    "step (compile, kernel builds and autotuning, forward, backward), each in a fresh "
    "process with empty caches; own_compile = torchloom's compile_fx calls (passes, "
    "kernels); aot_eager = Dynamo and aot_autograd alone.",
    70, 0,
    ("first_step_1_s", "first_step_12_s", "ratio_12_over_1", "own_compile_1_s",
     "own_compile_12_s", "own_ratio_12_over_1", "match"),
    lambda quick: [Row(b, lambda device, full: None, _smoke_stack,
                       lambda ctx, built, b=b: _measure_compile(ctx, b))
                   for b in ("torchloom", "inductor", "aot_eager")])


# --- Hugging Face models from configs: a training step --------------------------------

def _hf(kind: str, device: str, full: bool):
    """(model, batch): GPT-2 or Llama from a config (random weights), dropout off."""
    import transformers as t
    torch.manual_seed(0)
    if kind == "gpt2_train":
        width, heads = (768, 12) if full else (32, 2)
        config = t.GPT2Config(n_layer=2, n_head=heads, n_embd=width, vocab_size=8192,
                              n_positions=512, resid_pdrop=0.0, embd_pdrop=0.0,
                              attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model, (batch, seq) = t.GPT2LMHeadModel(config), ((8, 256) if full else (2, 8))
    else:
        width, heads, kv, inner = (1024, 16, 4, 2816) if full else (32, 2, 1, 64)
        config = t.LlamaConfig(num_hidden_layers=2, num_attention_heads=heads,
                               num_key_value_heads=kv, hidden_size=width,
                               intermediate_size=inner, vocab_size=8192,
                               max_position_embeddings=512)
        model, (batch, seq) = t.LlamaForCausalLM(config), ((4, 256) if full else (2, 8))
    model.config.use_cache = False
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 8192, (batch, seq), generator=g)
    labels = torch.randint(0, 8192, (batch, seq), generator=g)
    return model.to(device).train(), {"input_ids": ids.to(device), "labels": labels.to(device)}


def _hf_step(model, fn, batch):
    """One training step; returns the loss (gradients left on the parameters)."""
    for p in model.parameters():
        p.grad = None
    out = fn(**batch)
    out.loss.backward()
    return out.loss.detach()


def _measure_hf(ctx, built) -> dict:
    model, batch = built
    want = (_hf_step(model, model, batch), [p.grad.clone() for p in model.parameters()])
    models = {"inductor": copy.deepcopy(model), "torchloom": copy.deepcopy(model)}
    compiled = {b: compile_variant(m, lambda f, m=m: _hf_step(m, f, batch), b)
                for b, m in models.items()}
    match = {b: matches((_hf_step(models[b], v.fn, batch),
                         [p.grad for p in models[b].parameters()]), want, 1e-3, 1e-4)
             for b, v in compiled.items()}
    pairs = {"eager": (model, model), **{b: (models[b], v.fn) for b, v in compiled.items()}}
    us = interleaved({b: (lambda m=m, f=f: wall_us(lambda i: _hf_step(m, f, batch), 10))
                      for b, (m, f) in pairs.items()}, ctx.rounds)
    loom, ind = compiled["torchloom"], compiled["inductor"]
    return {"eager_ms": us["eager"] / 1e3, "inductor_ms": us["inductor"] / 1e3,
            "torchloom_ms": us["torchloom"] / 1e3,
            "speedup_vs_inductor": us["inductor"] / us["torchloom"],
            "speedup_vs_eager": us["eager"] / us["torchloom"],
            "compile_s_loom_inductor": [loom.compile_s, ind.compile_s],
            "kernels_loom_inductor": [loom.kernels, ind.kernels],
            "codegens": list(loom.codegens), "match": match["torchloom"],
            "inductor_match": match["inductor"], "notes": list(loom.notes[:3])}


HF_MODELS = Part(
    "hf_models", "Hugging Face models from configs (2 layers, random weights, dropout off): "
    "GPT-2 (width 768, batch 8 x 256) and Llama (width 1024, GQA 16/4, batch 4 x 256), one "
    "training step (forward with labels, backward): wall ms per step, interleaved rounds; "
    "compile = the first step.",
    95, 0,
    ("eager_ms", "inductor_ms", "torchloom_ms", "speedup_vs_inductor", "speedup_vs_eager",
     "compile_s_loom_inductor", "kernels_loom_inductor", "codegens", "match"),
    lambda quick: [Row(k, lambda device, full, k=k: _hf(k, device, full),
                       lambda built: _hf_step(built[0], built[0], built[1]), _measure_hf)
                   for k in ("gpt2_train", "llama_train")])
