"""Tiny Hugging Face models (configs built locally: nothing is downloaded) and one
training step of each through ``torch.compile(backend="torchloom")`` against eager, for
``test_hf_models.py`` (automatic dynamic shapes) and ``test_hf_models_dynamic.py``
(``dynamic=True``): two files, so that parallel workers share them."""

from __future__ import annotations

import torch
import transformers

from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler


def tiny(kind: str):
    t = transformers
    if kind == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100,
                                              n_positions=64, bos_token_id=0, eos_token_id=0))
    if kind == "bert":
        return t.BertForSequenceClassification(t.BertConfig(
            num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
            vocab_size=100, max_position_embeddings=64))
    if kind == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, hidden_size=32,
            intermediate_size=64, vocab_size=100, max_position_embeddings=64))
    if kind == "t5":
        return t.T5ForConditionalGeneration(t.T5Config(
            num_layers=2, num_decoder_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64,
            vocab_size=100, decoder_start_token_id=0, pad_token_id=0))
    return t.ViTForImageClassification(t.ViTConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
        image_size=16, patch_size=4, num_labels=3))


def batch(kind: str, seq: int) -> dict:
    g = torch.Generator().manual_seed(seq)
    ids = torch.randint(0, 100, (2, seq), generator=g)
    if kind == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=g),
                "labels": torch.tensor([0, 2])}
    if kind == "bert":
        return {"input_ids": ids, "labels": torch.tensor([0, 1]),
                "attention_mask": (torch.rand(2, seq, generator=g) > 0.2).long()}
    return {"input_ids": ids, "labels": torch.randint(0, 100, (2, seq), generator=g)}


def step(model, fn, inputs) -> tuple:
    model.zero_grad()
    torch.manual_seed(0)  # dropout draws the same masks on both sides
    out = fn(**inputs)
    out.loss.backward()
    return out.loss.detach(), out.logits.detach(), [p.grad.clone() for p in model.parameters()
                                                    if p.grad is not None]


def check_training_step(kind: str, dynamic: bool | None) -> None:
    """Three lengths of ``kind``'s training step against eager; no graph on eager and
    nearly every fusion group a C kernel."""
    torch.manual_seed(0)
    model = tiny(kind)
    model.config.use_cache = False
    compiler = Compiler("default", compile_cache=False)
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=dynamic, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    for seq in (8, 13, 5):
        inputs = batch(kind, seq)
        loss, logits, grads = step(model, compiled, inputs)
        eager_loss, eager_logits, eager_grads = step(model, model, inputs)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-5)
        assert len(grads) == len(eager_grads)
        torch.testing.assert_close(grads, eager_grads, rtol=1e-3, atol=1e-5)
    assert compiler.compilations
    assert [c.fallback_reason for c in compiler.compilations if c.fallback_reason] == []
    choices = [ch for c in compiler.compilations for ch in c.compiled.choices]
    eager = [[str(r) for r in ch.fallback_reasons if r.codegen == "cpu"]
             for ch in choices if ch.codegen == "eager"]
    assert len(eager) <= max(2, len(choices) // 10), eager  # measured: 1-4 of 24-142
    torch._dynamo.reset()
