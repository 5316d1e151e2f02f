"""Models beyond the zoo: many Hugging Face architectures, built tiny from configs (random
weights, nothing downloaded), compiled with ``torch.compile(backend="torchloom")`` and
checked against eager PyTorch. Counted, not timed (the zoo, ``model_zoo.py``, times).

Each architecture runs three stages on one compiled model, with the same weights as an
eager copy, training last (the stages before see the model as built):

- ``train``: a training step's loss and every parameter's gradient (dropout off, or at
  ``--dropout``: every run from one seed, the generator's state after it eager's),
- ``infer``: the logits at a first size, then at a second (batch or length: the second
  compiles symbolic sizes, as a server's second request does),
- ``decode`` (decoders with a key/value cache): a left-padded prompt, then
  ``DECODE_STEPS`` tokens one at a
  time through the model's key/value cache, as ``generate`` feeds it (each step's logits),

and reports, per architecture, the fusion groups torchloom made, those left on the eager
codegen (with the reasons the native codegens gave), graphs that fell back whole, each
stage's largest error as a share of what it is allowed (a stage passes at 1 or below),
and any exception. The exit status is 1 when any stage failed or raised.

- ``infer`` and ``decode``: ``max |compiled - eager| / max |eager|`` over the logits,
  allowed 1e-3 (fp32) or 3e-2 (``--dtype bfloat16``, inference only, or ``--autocast``:
  every stage under ``torch.autocast("cpu", torch.bfloat16)``).
- ``train``: the loss and each gradient against a float64 copy of the model (the exact
  answer, near enough): torchloom's error may be up to ``SLACK`` times eager's own plus
  ``ABSOLUTE`` of the tensor's scale (its largest value, and at least ``FLOOR`` of the
  largest gradient's). Compared with eager alone, an ill-conditioned gradient (a bias
  before a batch norm, sums of large terms that cancel) differs by percents between two
  correct fp32 orders of summation; against float64 both sides' errors show.

    .venv/bin/python benchmarks/model_survey.py                # every architecture
    .venv/bin/python benchmarks/model_survey.py --models mistral swin --dynamic
    .venv/bin/python benchmarks/model_survey.py --dtype bfloat16 --stages infer
    .venv/bin/python benchmarks/model_survey.py --threads 2    # the kernels' parallel forms
    .venv/bin/python benchmarks/model_survey.py --autocast     # mixed precision, bf16
    .venv/bin/python benchmarks/model_survey.py --dropout 0.1  # training with dropout
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_zoo  # noqa: E402

VOCAB = 128
STAGES = ("train", "infer", "decode")
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 3e-2}
DECODE_STEPS = 4
SEED = 1234  # each training run starts from it (dropout's masks)

# ---- the architectures ---------------------------------------------------------------------
_DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
_ENCODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=128)
_SEQ2SEQ = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                decoder_ffn_dim=128, max_position_embeddings=128, pad_token_id=0,
                decoder_start_token_id=0, eos_token_id=2, bos_token_id=1)
_SPEECH = dict(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, conv_dim=(32, 32), conv_stride=(4, 2),
               conv_kernel=(8, 4), num_conv_pos_embeddings=16,
               num_conv_pos_embedding_groups=4,
               mask_time_prob=0.0)  # no random masking in training
_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            image_size=32, patch_size=8, num_labels=10)
_GPT2_STYLE = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)


@attrs.frozen
class Arch:
    """``model_type`` (a transformers config name), ``head`` (how it is built and fed:
    one of ``inputs``'s), ``config``: the tiny config's fields; ``sizes``: the first and
    second size of the inference stage (tokens, or images per batch, or pixels);
    ``kv_cache``: a decoder whose outputs carry ``past_key_values`` (decoded)."""

    model_type: str
    head: str
    config: dict
    sizes: tuple[int, int] = (16, 24)
    kv_cache: bool = True

    @property
    def decodes(self) -> bool:
        return self.head == "causal" and self.kv_cache


ARCHS = {a.model_type if n is None else n: a for n, a in (
    (None, Arch("llama", "causal", _DECODER)),
    (None, Arch("mistral", "causal", dict(_DECODER, sliding_window=8))),
    (None, Arch("qwen2", "causal", _DECODER)),
    (None, Arch("qwen3", "causal", dict(_DECODER, head_dim=16))),
    (None, Arch("phi", "causal", dict(_ENCODER, partial_rotary_factor=0.5))),
    (None, Arch("phi3", "causal", dict(_DECODER, pad_token_id=0))),
    (None, Arch("gemma", "causal", dict(_DECODER, head_dim=16))),
    (None, Arch("gemma2", "causal", dict(_DECODER, head_dim=16, sliding_window=8))),
    (None, Arch("gemma3_text", "causal", dict(_DECODER, head_dim=16, sliding_window=8))),
    (None, Arch("stablelm", "causal", _DECODER)),
    (None, Arch("olmo", "causal", _DECODER)),
    (None, Arch("mixtral", "causal", dict(_DECODER, num_local_experts=4,
                                          num_experts_per_tok=2))),
    (None, Arch("starcoder2", "causal", dict(_DECODER, sliding_window=8))),
    (None, Arch("granite", "causal", _DECODER)),
    (None, Arch("cohere", "causal", _DECODER)),
    (None, Arch("mamba", "causal", dict(vocab_size=VOCAB, hidden_size=64, state_size=8,
                                        num_hidden_layers=2, expand=2, conv_kernel=4),
                kv_cache=False)),  # a state space model: its cache is a state
    (None, Arch("xlnet", "causal", dict(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4,
                                        d_inner=128), kv_cache=False)),  # (memories)
    (None, Arch("gpt_neox", "causal", dict(_ENCODER, rotary_pct=0.25))),
    (None, Arch("gpt2", "causal", _GPT2_STYLE)),
    (None, Arch("gptj", "causal", dict(_GPT2_STYLE, rotary_dim=8))),
    (None, Arch("codegen", "causal", dict(_GPT2_STYLE, rotary_dim=8, n_ctx=128))),
    (None, Arch("gpt_bigcode", "causal", dict(_GPT2_STYLE, multi_query=True))),
    (None, Arch("gpt_neo", "causal", dict(
        vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, window_size=8,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=128))),
    (None, Arch("opt", "causal", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=128, word_embed_proj_dim=64, max_position_embeddings=128))),
    (None, Arch("bloom", "causal", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2,
                                        n_head=4))),
    (None, Arch("falcon", "causal", dict(vocab_size=VOCAB, hidden_size=64,
                                         num_hidden_layers=2, num_attention_heads=4))),
    (None, Arch("mpt", "causal", dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2,
                                      expansion_ratio=2, max_seq_len=64))),
    (None, Arch("bert", "masked", _ENCODER)),
    (None, Arch("roberta", "masked", dict(_ENCODER, pad_token_id=0))),
    (None, Arch("electra", "masked", dict(_ENCODER, embedding_size=32))),
    (None, Arch("albert", "masked", dict(_ENCODER, embedding_size=32))),
    (None, Arch("deberta-v2", "masked", dict(_ENCODER, relative_attention=True,
                                             position_buckets=16))),
    (None, Arch("distilbert", "masked", dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4,
                                             hidden_dim=128, max_position_embeddings=128))),
    (None, Arch("fnet", "masked", _ENCODER)),  # Fourier mixing: an FFT between real ops
    (None, Arch("modernbert", "masked", dict(_ENCODER, global_attn_every_n_layers=2,
                                             local_attention=8, pad_token_id=0))),
    (None, Arch("mobilebert", "masked", dict(_ENCODER, embedding_size=32,
                                             intra_bottleneck_size=32, true_hidden_size=32,
                                             num_feedforward_networks=2))),
    (None, Arch("funnel", "masked", dict(vocab_size=VOCAB, d_model=64, n_head=4, d_head=16,
                                         d_inner=128, block_sizes=[1, 1],
                                         num_decoder_layers=1))),
    (None, Arch("t5", "seq2seq", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128,
                                      num_layers=2, num_heads=4, decoder_start_token_id=0))),
    (None, Arch("bart", "seq2seq", _SEQ2SEQ)),
    (None, Arch("mbart", "seq2seq", _SEQ2SEQ)),
    (None, Arch("pegasus", "seq2seq", _SEQ2SEQ)),
    (None, Arch("marian", "seq2seq", _SEQ2SEQ)),
    (None, Arch("blenderbot", "seq2seq", _SEQ2SEQ)),
    (None, Arch("led", "seq2seq", dict(_SEQ2SEQ, max_encoder_position_embeddings=128,
                                       max_decoder_position_embeddings=128,
                                       attention_window=[8, 8]))),
    (None, Arch("whisper", "whisper", dict(_SEQ2SEQ, num_mel_bins=16,
                                           max_source_positions=32, max_target_positions=64))),
    (None, Arch("wav2vec2", "ctc", _SPEECH, (800, 1200))),
    (None, Arch("hubert", "ctc", _SPEECH, (800, 1200))),
    (None, Arch("wavlm", "ctc", dict(_SPEECH, num_buckets=32, max_bucket_distance=64),
                (800, 1200))),
    (None, Arch("vit", "image", _VIT, (2, 3))),
    (None, Arch("deit", "image", dict(_VIT, architectures=["DeiTForImageClassification"]),
                (2, 3))),
    (None, Arch("beit", "image", dict(_VIT, use_relative_position_bias=True), (2, 3))),
    (None, Arch("dinov2", "image", dict(_VIT, mlp_ratio=2), (2, 3))),
    (None, Arch("levit", "image", dict(image_size=64, hidden_sizes=[32, 48, 64],
                                       num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
                                       key_dim=[8, 8, 8], num_labels=10,
                                       architectures=["LevitForImageClassification"]),
                (2, 3))),
    (None, Arch("swin", "image", dict(image_size=32, patch_size=2, embed_dim=16,
                                      depths=[1, 1], num_heads=[2, 4], window_size=4,
                                      num_labels=10), (2, 3))),
    (None, Arch("convnext", "pixels", dict(num_stages=2, depths=[1, 1],
                                           hidden_sizes=[16, 32], num_labels=10), (32, 48))),
    (None, Arch("resnet", "pixels", dict(embedding_size=16, hidden_sizes=[16, 32],
                                         depths=[1, 1], num_labels=10), (32, 48))),
    (None, Arch("regnet", "pixels", dict(embedding_size=16, hidden_sizes=[16, 32],
                                         depths=[1, 1], groups_width=8, num_labels=10),
                (32, 48))),
    (None, Arch("mobilenet_v2", "pixels", dict(image_size=32, depth_multiplier=0.35,
                                               num_labels=10), (32, 48))),
    (None, Arch("mobilevit", "pixels", dict(
        image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 48, 64,
                                                                      80],
        num_labels=10), (64, 96))),
    (None, Arch("efficientnet", "pixels", dict(image_size=32, width_coefficient=0.25,
                                               depth_coefficient=0.25, hidden_dim=320,
                                               num_labels=10),
                (32, 48))),
    (None, Arch("segformer", "pixels", dict(num_encoder_blocks=2, depths=[1, 1],
                                            sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                            num_attention_heads=[1, 2],
                                            patch_sizes=[7, 3], strides=[4, 2],
                                            decoder_hidden_size=32, num_labels=10),
                (32, 48))),
    (None, Arch("clip", "clip", dict(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=64),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8),
        projection_dim=16), (8, 12))),
)}


def build(arch: Arch, dropout: float = 0.0) -> torch.nn.Module:
    """``arch``'s model, every dropout probability of its config ``dropout`` (layer drop,
    which skips whole layers, stays off)."""
    import transformers as t
    config = t.AutoConfig.for_model(arch.model_type, **arch.config)
    for name in dir(config):
        if "drop" in name and not name.startswith("_"):
            value = getattr(config, name, None)
            if isinstance(value, float):
                setattr(config, name, 0.0 if "layerdrop" in name else dropout)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    auto = {"causal": t.AutoModelForCausalLM, "masked": t.AutoModelForMaskedLM,
            "seq2seq": t.AutoModelForSeq2SeqLM, "whisper": t.AutoModelForSpeechSeq2Seq,
            "ctc": t.AutoModelForCTC, "image": t.AutoModelForImageClassification,
            "pixels": t.AutoModelForImageClassification, "clip": t.AutoModel}[arch.head]
    return auto.from_config(config)


def _ids(g, *shape, high=VOCAB):
    return torch.randint(3, high, shape, generator=g)


def inputs(arch: Arch, model: torch.nn.Module, size: int, g: torch.Generator) -> dict:
    """One batch for ``arch`` at ``size``, labels included (the inference stage drops them)."""
    config = model.config
    if arch.head == "causal":
        ids = _ids(g, 2, size)
        return {"input_ids": ids, "labels": ids}
    if arch.head == "masked":
        mask = torch.ones(2, size, dtype=torch.long)
        mask[1, size - size // 4:] = 0  # one padded row
        return {"input_ids": _ids(g, 2, size), "attention_mask": mask,
                "labels": _ids(g, 2, size)}
    if arch.head == "seq2seq":
        target = _ids(g, 2, size // 2 + 1)
        return {"input_ids": _ids(g, 2, size), "decoder_input_ids": target[:, :-1].clone(),
                "labels": target[:, 1:].clone()}
    if arch.head == "whisper":  # the encoder takes exactly 2 * max_source_positions frames
        target = _ids(g, 2, size // 2 + 1)
        return {"input_features": torch.randn(2, config.num_mel_bins,
                                              2 * config.max_source_positions, generator=g),
                "decoder_input_ids": target[:, :-1].clone(), "labels": target[:, 1:].clone()}
    if arch.head == "ctc":
        return {"input_values": torch.randn(2, size, generator=g),
                "labels": _ids(g, 2, 4, high=config.vocab_size)}
    if arch.head in ("image", "pixels"):
        n, side = (size, config.image_size) if arch.head == "image" else (2, size)
        return {"pixel_values": torch.randn(n, 3, side, side, generator=g),
                "labels": torch.randint(0, config.num_labels, (n,), generator=g)}
    if arch.head == "clip":
        side = config.vision_config.image_size
        return {"input_ids": _ids(g, 2, size), "pixel_values": torch.randn(2, 3, side, side,
                                                                            generator=g),
                "return_loss": True}
    raise ValueError(f"head {arch.head!r}")


# ---- comparing -----------------------------------------------------------------------------
#: the least scale a gradient's error is measured against, as a share of the largest
#: gradient's largest value: a gradient that is zero in exact arithmetic (a key
#: projection's bias under softmax, a convolution's bias before a batch norm) or tiny beside
#: the others (queries and keys of near-uniform attention) holds rounding noise on each side
FLOOR = 1e-3
#: a training tensor passes when torchloom's error against float64 is at most ``SLACK``
#: times eager's plus ``ABSOLUTE`` times its scale
SLACK, ABSOLUTE = 3.0, 1e-5


def _pair(got, want):
    """Both as float64, or None when they cannot be compared value by value (inf error)."""
    if got is None or want is None or got.shape != want.shape:
        return None
    return got.detach().double(), want.detach().double()


def error(got: torch.Tensor | None, want: torch.Tensor | None, floor: float = 0.0) -> float:
    """``max |got - want| / max(max |want|, floor)`` (0 for two missing gradients; inf for
    one, or for non-finite values where eager's are finite)."""
    if got is None and want is None:
        return 0.0
    pair = _pair(got, want)
    if pair is None:
        return math.inf
    got, want = pair
    finite = torch.isfinite(want)
    bad, odd = got[~finite], want[~finite]  # must match: inf for inf of its sign, nan for nan
    if not torch.equal(finite, torch.isfinite(got)) or not (
            (bad == odd) | (bad.isnan() & odd.isnan())).all():
        return math.inf
    if not finite.any():
        return 0.0
    scale = max(want[finite].abs().max().item(), floor) or 1.0
    return (got[finite] - want[finite]).abs().max().item() / scale


def train_error(ours, eager, exact, floor: float = 0.0) -> float:
    """How far ``ours`` is from ``exact`` (float64) as a share of what it may be: ``SLACK``
    times eager's own error plus ``ABSOLUTE`` of the scale (``max |exact|``, at least
    ``floor``). At most 1 passes; inf where ``ours`` is missing or non-finite and the others
    are not."""
    e_ours, e_eager = error(ours, exact, floor), error(eager, exact, floor)
    if math.isinf(e_eager):  # float64 disagrees with eager too (an overflow): eager decides
        return error(ours, eager, floor) / TOLERANCE[torch.float32]
    return e_ours / (SLACK * e_eager + ABSOLUTE)


def _logits(out) -> torch.Tensor:
    for name in ("logits", "logits_per_image"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    return out[0]


@attrs.define
class Row:
    name: str
    errors: dict[str, float] = attrs.field(factory=dict)  # stage -> largest error
    raised: str = ""  # the first exception, one line
    groups: model_zoo.EagerGroups | None = None
    seconds: float = 0.0

    def ok(self) -> bool:
        return not self.raised and all(e <= 1.0 for e in self.errors.values())


def survey(name: str, stages, dynamic: bool, dtype: torch.dtype, cache: Path,
           autocast: bool = False, dropout: float = 0.0) -> Row:
    """One architecture's row. ``autocast``: the model's calls (eager's and the compiled
    one's, not the float64 copy's) run under ``torch.autocast("cpu", torch.bfloat16)``,
    inference then judged at bfloat16's tolerance. ``dropout``: the configs' dropout
    probabilities in training; each of the three training runs starts from one seed (the
    float64 copy draws the same masks), and the random generator's state after the
    compiled step must be eager's."""
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler

    arch, row, start = ARCHS[name], Row(name), time.perf_counter()
    compiler = Compiler("default", cache_dir=cache, compile_cache=False)
    try:
        torch.manual_seed(0)
        eager = build(arch, dropout).to(dtype)
        ours = copy.deepcopy(eager)
        fn = torch.compile(ours, backend=lambda gm, ex: torchloom_backend(
            gm, ex, options={"compiler": compiler}), dynamic=True if dynamic else None)
        g = torch.Generator().manual_seed(1)
        tolerance = TOLERANCE[torch.bfloat16 if autocast else dtype]

        def amp():
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
        if "infer" in stages:
            eager.eval(), ours.eval()
            worst = 0.0
            for size in arch.sizes:
                batch = {k: v for k, v in inputs(arch, eager, size, g).items()
                         if k not in ("labels", "return_loss")}
                with torch.no_grad(), amp():
                    worst = max(worst, error(_logits(fn(**batch)), _logits(eager(**batch))))
            row.errors["infer"] = worst / tolerance
        if "decode" in stages and arch.decodes:
            eager.eval(), ours.eval()
            with torch.no_grad(), amp():
                row.errors["decode"] = decode(fn, eager, arch.sizes[0], g) / tolerance
        if "train" in stages:
            row.errors["train"] = train_stage(eager, ours, fn,
                                              inputs(arch, eager, arch.sizes[0], g), amp)
    except Exception as e:  # reported, and the survey goes on to the next architecture
        row.raised = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        traceback.print_exc()
    finally:
        torch._dynamo.reset()
    row.groups = model_zoo.eager_groups(compiler)
    row.seconds = time.perf_counter() - start
    return row


def train_stage(eager, ours, fn: Callable, batch: dict, amp: Callable) -> float:
    """A training step of ``eager``, of ``ours`` (called through ``fn``) and of a float64
    copy of ``eager`` made first, each from ``SEED`` (``amp()`` around the first two's
    forward): the largest :func:`train_error` over the loss, the gradients and the
    floating buffers the step updated (batch norms' running statistics), gradients
    measured against at least ``FLOOR`` of the largest gradient and buffers of the
    largest buffer. Raises where the generator's state after the compiled step is not
    eager's."""
    exact = copy.deepcopy(eager).double()
    if getattr(exact.config, "_experts_implementation", None) not in (None, "eager"):
        exact.set_experts_implementation("eager")  # grouped_mm takes no float64
    wide = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in batch.items()}
    runs, states = [], []
    for model, call, feed in ((eager, eager, batch), (ours, fn, batch), (exact, exact, wide)):
        model.train()
        torch.manual_seed(SEED)
        with amp() if model is not exact else contextlib.nullcontext():
            loss = call(**feed).loss
        loss.backward()
        states.append(torch.get_rng_state())
        runs.append(([loss], [p.grad for p in model.parameters()],
                     [b for b in model.buffers() if b.is_floating_point()]))
    if not torch.equal(states[0], states[1]):
        raise AssertionError("the random generator's state after the compiled training "
                             "step is not eager's")
    worst = 0.0
    for kind, (want, got, ref) in enumerate(zip(*runs)):
        floor = 0.0 if kind == 0 else FLOOR * max(
            (r.abs().max().item() for r in ref if r is not None and r.numel()), default=0.0)
        worst = max([worst] + [train_error(a, b, c, floor) for a, b, c in zip(got, want, ref)])
    return worst


def decode(fn: Callable, eager: torch.nn.Module, size: int, g: torch.Generator) -> float:
    """The largest logits error of a prompt of ``size`` tokens (its second row left-padded)
    and ``DECODE_STEPS`` greedy steps after it, each fed the cache the step before made:
    the compiled model is fed its own cache, the next token eager's choice."""
    ids = _ids(g, 2, size)
    mask = torch.ones(2, size, dtype=torch.long)
    mask[1, :size // 4] = 0
    feed, worst, caches = {"input_ids": ids}, 0.0, (None, None)
    for _ in range(DECODE_STEPS + 1):
        outs = [call(**feed, attention_mask=mask, past_key_values=cache, use_cache=True)
                for call, cache in zip((fn, eager), caches)]
        worst = max(worst, error(outs[0].logits, outs[1].logits))
        caches = tuple(o.past_key_values for o in outs)
        feed = {"input_ids": outs[1].logits[:, -1:].argmax(-1)}
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
    return worst


def table(rows: list[Row]) -> str:
    lines = ["| model | groups | on eager | graphs on eager | train error / allowed "
             "| infer error / allowed | decode error / allowed | result |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        g = r.groups
        errs = [f"{r.errors[s]:.2g}" if s in r.errors else "-" for s in STAGES]
        result = ("raised: " + r.raised.replace("|", "/")) if r.raised else (
            "ok" if r.ok() else "**above allowed**")
        lines.append(f"| {r.name} | {g.groups} | {g.on_eager} | {len(g.fallbacks)} | "
                     + " | ".join(errs) + f" | {result} |")
    return "\n".join(lines)


def reasons(rows: list[Row]) -> str:
    lines = []
    for r in rows:
        for why, n in r.groups.reasons.items():
            lines.append(f"- {r.name}: {n} group(s): {why}")
        lines.extend(f"- {r.name}: graph on eager: {f}" for f in r.groups.fallbacks)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--dynamic", action="store_true",
                        help="torch.compile(dynamic=True): every size symbolic at once")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--autocast", action="store_true",
                        help='every stage under torch.autocast("cpu", torch.bfloat16)')
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="the configs' dropout probabilities in training (0: off)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    stages = args.stages if dtype == torch.float32 else [s for s in args.stages
                                                          if s != "train"]
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as root:
        for i, name in enumerate(args.models, 1):
            row = survey(name, stages, args.dynamic, dtype, Path(root), args.autocast,
                         args.dropout)
            rows.append(row)
            print(f"[{i}/{len(args.models)}] {name}: {row.groups.on_eager} of "
                  f"{row.groups.groups} groups on eager, errors {row.errors}"
                  f"{', raised ' + row.raised if row.raised else ''} ({row.seconds:.1f} s)",
                  flush=True)
    text = table(rows) + "\n\n" + (reasons(rows) or "No group on eager.")
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if all(r.ok() for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
