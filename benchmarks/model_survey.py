"""Models beyond the zoo: many Hugging Face architectures, built tiny from configs (random
weights, nothing downloaded), compiled with ``torch.compile(backend="torchloom")`` and
checked against eager PyTorch. Counted, not timed (the zoo, ``model_zoo.py``, times).

Each architecture runs up to three stages on one compiled model, with the same weights as an
eager copy, training last (the stages before see the model as built):

- ``train``: a training step's loss and every parameter's gradient (dropout off, or at
  ``--dropout``: every run from one seed, the generator's state after it eager's),
- ``infer``: the logits at a first size, then at a second (batch or length: the second
  compiles symbolic sizes, as a server's second request does),
- ``decode`` (decoders with a cache): a left-padded prompt, then ``DECODE_STEPS`` tokens
  one at a time through the model's key/value cache, or a state space model's state
  (Mamba's ``cache_params``), each step's logits,

and reports, per architecture, the fusion groups torchloom made, those left on the eager
codegen (with the reasons the native codegens gave), graphs that fell back whole, each
stage's largest error as a share of what it is allowed (a stage passes at 1 or below),
and any exception. The exit status is 1 when any stage failed or raised.

- ``infer`` and ``decode``: ``max |compiled - eager| / max |eager|`` over the logits,
  allowed 1e-3 (fp32) or 3e-2 (``--dtype bfloat16``, inference only, or ``--autocast``:
  every stage under ``torch.autocast("cpu", torch.bfloat16)``).
- ``train``: the loss, each gradient and each floating buffer (batch norms' running
  statistics) against a float64 copy of the model (the exact answer, near enough):
  torchloom's error may be up to ``SLACK`` times eager's own plus ``ABSOLUTE`` of the
  tensor's scale (its largest value, and at least ``FLOOR`` of the largest gradient's,
  or buffer's). Eager's own error is the larger of its step's and of a step with every
  weight one float away (``nudge``): one lucky rounding of an ill-conditioned gradient
  (LeViT's batch norms over two images: eager's own error there ranges 6e-4 to 5e-3 of
  the scale with the thread count) does not set the bound alone. Compared with eager
  alone, an ill-conditioned gradient (a bias before a batch norm, sums of large terms
  that cancel) differs by percents between two correct fp32 orders of summation; against
  float64 both sides' errors show.

    .venv/bin/python benchmarks/model_survey.py                # every architecture
    .venv/bin/python benchmarks/model_survey.py --models mistral swin --dynamic
    .venv/bin/python benchmarks/model_survey.py --dtype bfloat16 --stages infer
    .venv/bin/python benchmarks/model_survey.py --threads 2    # the kernels' parallel forms
    .venv/bin/python benchmarks/model_survey.py --autocast     # mixed precision, bf16
    .venv/bin/python benchmarks/model_survey.py --dropout 0.1  # training with dropout
    .venv/bin/python benchmarks/model_survey.py --channels-last  # images NHWC
    .venv/bin/python benchmarks/model_survey.py --attention eager  # softmax written out
    .venv/bin/python benchmarks/model_survey.py --checkpoint --stages train  # recomputed
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
from survey_archs import ARCHS, VOCAB, Arch  # noqa: E402,F401 (ARCHS: the tests' too)

STAGES = ("train", "infer", "decode")
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 3e-2}
DECODE_STEPS = 4
SEED = 1234  # each training run starts from it (dropout's masks)


def build(arch: Arch, dropout: float = 0.0, attention: str | None = None,
          checkpoint: bool = False) -> torch.nn.Module:
    """``arch``'s model, every dropout probability of its config ``dropout`` (layer drop,
    which skips whole layers, stays off); ``attention``: its attention implementation
    (``"eager"``: softmax and products written out; default: the model's, SDPA mostly);
    ``checkpoint``: activation checkpointing (each layer's activations recomputed in the
    backward, non-reentrant) where the model supports it."""
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
    model = auto.from_config(config, **({"attn_implementation": attention} if attention else {}))
    if checkpoint and model.supports_gradient_checkpointing:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    return model


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


def train_error(ours, eager, exact, floor: float = 0.0, nudged=None) -> float:
    """How far ``ours`` is from ``exact`` (float64) as a share of what it may be: ``SLACK``
    times eager's own error plus ``ABSOLUTE`` of the scale (``max |exact|``, at least
    ``floor``). Eager's error is the larger of ``eager``'s and ``nudged``'s (eager's step
    with every weight one float away: :func:`nudge`), so that one lucky rounding of an
    ill-conditioned gradient does not set the bound. At most 1 passes; inf where ``ours``
    is missing or non-finite and the others are not."""
    e_ours, e_eager = error(ours, exact, floor), error(eager, exact, floor)
    if math.isinf(e_eager):  # float64 disagrees with eager too (an overflow): eager decides
        return error(ours, eager, floor) / TOLERANCE[torch.float32]
    if nudged is not None:
        e_eager = max(e_eager, error(nudged, exact, floor))
    return e_ours / (SLACK * e_eager + ABSOLUTE)


def nudge(model: torch.nn.Module, seed: int = SEED) -> torch.nn.Module:
    """A copy of ``model`` with each floating parameter's elements moved to the next
    representable value up or down (at random, from ``seed``): how far eager's answers
    move under one rounding's change shows how ill-conditioned they are."""
    copied = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copied.parameters():
            if p.is_floating_point():
                up = torch.rand(p.shape, generator=g) < 0.5
                p.copy_(torch.nextafter(p, torch.where(up, math.inf, -math.inf).to(p.dtype)))
    return copied


def as_dtype(batch: dict, dtype: torch.dtype) -> dict:
    """``batch`` with its floating tensors in ``dtype`` (token ids, masks and flags as
    they are)."""
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in batch.items()}


def in_layout(batch: dict, channels_last: bool) -> dict:
    """``batch`` with its 4-D floating tensors (images) in ``torch.channels_last`` layout
    where ``channels_last``."""
    if not channels_last:
        return batch
    return {k: v.contiguous(memory_format=torch.channels_last)
            if torch.is_tensor(v) and v.dim() == 4 and v.is_floating_point() else v
            for k, v in batch.items()}


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
        """No exception, some stage measured, and every stage within what it may be."""
        return not self.raised and bool(self.errors) and \
            all(e <= 1.0 for e in self.errors.values())


def survey(name: str, stages, dynamic: bool, dtype: torch.dtype, cache: Path,
           autocast: bool = False, dropout: float = 0.0, channels_last: bool = False,
           attention: str | None = None, checkpoint: bool = False) -> Row:
    """One architecture's row. ``autocast``: the model's calls (eager's and the compiled
    one's, not the float64 copy's) run under ``torch.autocast("cpu", torch.bfloat16)``,
    inference then judged at bfloat16's tolerance. ``dropout``: the configs' dropout
    probabilities in training; each of the three training runs starts from one seed (the
    float64 copy draws the same masks), and the random generator's state after the
    compiled step must be eager's. ``channels_last``: the model's weights and its 4-D
    inputs (images) in ``torch.channels_last`` layout. ``attention``, ``checkpoint``: see
    :func:`build` (checkpointing: buffers not judged, see :func:`train_stage`)."""
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler

    arch, row, start = ARCHS[name], Row(name), time.perf_counter()
    compiler = Compiler("default", cache_dir=cache, compile_cache=False)
    try:
        torch.manual_seed(0)
        eager = build(arch, dropout, attention, checkpoint).to(dtype)
        if channels_last:
            eager = eager.to(memory_format=torch.channels_last)
        ours = copy.deepcopy(eager)
        fn = torch.compile(ours, backend=lambda gm, ex: torchloom_backend(
            gm, ex, options={"compiler": compiler}), dynamic=True if dynamic else None)
        g = torch.Generator().manual_seed(1)
        tolerance = TOLERANCE[torch.bfloat16 if autocast else dtype]

        def amp():
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)

        def feed(size: int) -> dict:
            return in_layout(inputs(arch, eager, size, g), channels_last)
        if "infer" in stages:
            eager.eval(), ours.eval()
            worst = 0.0
            for size in arch.sizes:
                batch = {k: v for k, v in as_dtype(feed(size), dtype).items()
                         if k not in ("labels", "return_loss")}  # (pixels, audio: the dtype)
                with torch.no_grad(), amp():
                    worst = max(worst, error(_logits(fn(**batch)), _logits(eager(**batch))))
            row.errors["infer"] = worst / tolerance
        if "decode" in stages and arch.decodes:
            eager.eval(), ours.eval()
            with torch.no_grad(), amp():
                row.errors["decode"] = decode(fn, eager, arch.sizes[0], g,
                                             arch.cache) / tolerance
        if "train" in stages:
            row.errors["train"] = train_stage(eager, ours, fn, feed(arch.sizes[0]), amp,
                                              buffers=not checkpoint)
    except Exception as e:  # reported, and the survey goes on to the next architecture
        row.raised = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        traceback.print_exc()
    finally:
        torch._dynamo.reset()
    row.groups = model_zoo.eager_groups(compiler)
    row.seconds = time.perf_counter() - start
    return row


def train_stage(eager, ours, fn: Callable, batch: dict, amp: Callable,
                buffers: bool = True) -> float:
    """A training step of ``eager``, of ``ours`` (called through ``fn``), of a float64
    copy of ``eager`` and of a nudged one (:func:`nudge`), both made first, each from
    ``SEED`` (``amp()`` around the forward of all but the float64 one): the largest
    :func:`train_error` over the loss, the gradients and the floating buffers the step
    updated (batch norms' running statistics), gradients measured against at least
    ``FLOOR`` of the largest gradient and buffers of the largest buffer (``buffers=False``:
    not judged; under activation checkpointing eager's recomputation updates batch norms'
    running statistics a second time, a compiled step, ``aot_eager``'s too, once). Raises
    where the generator's state after the compiled step is not eager's."""
    exact = copy.deepcopy(eager).double()
    if getattr(exact.config, "_experts_implementation", None) not in (None, "eager"):
        exact.set_experts_implementation("eager")  # grouped_mm takes no float64
    nudged = nudge(eager)
    wide = as_dtype(batch, torch.float64)
    runs, states = [], []
    for model, call, feed in ((eager, eager, batch), (ours, fn, batch), (exact, exact, wide),
                              (nudged, nudged, batch)):
        model.train()
        torch.manual_seed(SEED)
        with amp() if model is not exact else contextlib.nullcontext():
            loss = call(**feed).loss
        loss.backward()
        states.append(torch.get_rng_state())
        runs.append(([loss], [p.grad for p in model.parameters()],
                     [b for b in model.buffers() if b.is_floating_point() and buffers]))
    if not torch.equal(states[0], states[1]):
        raise AssertionError("the random generator's state after the compiled training "
                             "step is not eager's")
    worst = 0.0
    for kind, (want, got, ref, near) in enumerate(zip(*runs)):
        floor = 0.0 if kind == 0 else FLOOR * max(
            (r.abs().max().item() for r in ref if r is not None and r.numel()), default=0.0)
        worst = max([worst] + [train_error(a, b, c, floor, d)
                               for a, b, c, d in zip(got, want, ref, near)])
    return worst


def decode(fn: Callable, eager: torch.nn.Module, size: int, g: torch.Generator,
           name: str = "past_key_values") -> float:
    """The largest logits error of a prompt of ``size`` tokens (its second row left-padded)
    and ``DECODE_STEPS`` greedy steps after it, each fed the cache the step before made
    (keyword ``name``, as the outputs carry it): the compiled model is fed its own cache,
    the next token eager's choice."""
    ids = _ids(g, 2, size)
    mask = torch.ones(2, size, dtype=torch.long)
    mask[1, :size // 4] = 0
    feed, worst, caches = {"input_ids": ids}, 0.0, (None, None)
    for _ in range(DECODE_STEPS + 1):
        outs = [call(**feed, attention_mask=mask, **{name: cache}, use_cache=True)
                for call, cache in zip((fn, eager), caches)]
        worst = max(worst, error(outs[0].logits, outs[1].logits))
        caches = tuple(getattr(o, name) for o in outs)
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
            "ok" if r.ok() else "**above allowed**" if r.errors else "**nothing measured**")
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
    parser.add_argument("--channels-last", action="store_true",
                        help="weights and images in torch.channels_last layout")
    parser.add_argument("--attention", choices=("eager", "sdpa"),
                        help="the models' attention implementation (default: their own)")
    parser.add_argument("--checkpoint", action="store_true",
                        help="activation checkpointing in training, where a model has it")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    stages = args.stages if dtype == torch.float32 else [s for s in args.stages
                                                          if s != "train"]
    if not stages:
        parser.error(f"no stage to run: {', '.join(args.stages)} at {args.dtype} (training "
                     f"runs in float32 only)")
    torch.set_num_threads(args.threads)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as root:
        for i, name in enumerate(args.models, 1):
            row = survey(name, stages, args.dynamic, dtype, Path(root), args.autocast,
                         args.dropout, args.channels_last, args.attention, args.checkpoint)
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
