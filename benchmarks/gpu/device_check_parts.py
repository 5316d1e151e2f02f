"""The kernel-level parts of ``device_check.py``: the copy bandwidth, the anchor rows of
``benchmarks/gpu/test_triton_bench.py`` (eager, Inductor, torchloom; ``do_bench``, the L2
flushed, interleaved rounds; % of the copy roofline), two training steps against their
compulsory bytes and the byte model's estimate, and CUDA-graph replay of small-batch
models (torchloom ``mode="reduce-overhead"`` against Inductor's, wall clock per call).

Each row builds its workload at full size on the GPU and tiny on the CPU (the dry run).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from device_check_common import (Part, Row, compile_variant, copy_bandwidth, gpu_ms,
                                 interleaved, matches, measure_copy_bandwidth, wall_us)
from torchloom.tools import import_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str):
    """The module of ``examples/<name>.py``, entered in ``sys.modules``: Dynamo imports a
    function's module by name when it inlines the function (the LSTM step's cell)."""
    module = import_workload(EXAMPLES / f"{name}.py")
    return sys.modules.setdefault(module.__name__, module)


# --- copy bandwidth -----------------------------------------------------------------

def _measure_bandwidth(ctx, built) -> dict:
    bw = measure_copy_bandwidth(built)
    (ctx.out / "copy_bandwidth.json").write_text(json.dumps({"bytes_per_s": bw}) + "\n")
    return {"GB_per_s": bw / 1e9, "MiB_copied": built}


COPY_BANDWIDTH = Part(
    "copy_bandwidth", "Device-to-device copy of 512 MiB (read + write bytes over the median "
    "do_bench time): the bandwidth the roofline columns below divide by.", 10, 10,
    ("GB_per_s", "MiB_copied"),
    lambda quick: [Row("copy_512MiB", lambda device, full: 512 if full else 1,
                       lambda mib: torch.empty(mib * 2 ** 18).copy_(torch.ones(mib * 2 ** 18)),
                       _measure_bandwidth)])


# --- anchor rows (inference, torch.no_grad) ------------------------------------------

def _layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _bias_gelu(y, b):  # y: the bf16 output of a matmul
    return torch.nn.functional.gelu(y + b)


def _anchor(name: str, device: str, full: bool):
    """(function, inputs, compulsory bytes per call, tolerance), sizes of
    test_triton_bench.py on the GPU."""
    torch.manual_seed(0)
    rows, cols = (8192, 3072) if full else (256, 96)

    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device, dtype=dtype)

    if name == "gelu_bookend":
        x = t(rows, cols)
        return example("gelu_bookend").gelu_bookend, [x], 2 * x.nbytes, 1e-4
    if name == "transpose_bookend":
        x = t(768, 128, 64) if full else t(12, 16, 8)
        return example("transpose_bookend").transpose_bookend, [x], 2 * x.nbytes, 1e-4
    if name == "layer_norm":
        x = t(rows, cols)
        return _layer_norm, [x, torch.rand(cols, device=device), t(cols)], 2 * x.nbytes, 1e-4
    if name == "softmax":
        x = t(rows, cols)
        return _softmax, [x], 2 * x.nbytes, 1e-4
    if name == "bias_gelu_bf16":
        inner = 1024 if full else 32
        y = t(rows, inner, dtype=torch.bfloat16) @ (t(inner, cols, dtype=torch.bfloat16) * 0.03)
        b = t(cols, dtype=torch.bfloat16)
        return _bias_gelu, [y, b], 2 * y.nbytes + b.nbytes, 2e-2
    if name == "lstm_cell":
        b, h = (64, 1024) if full else (4, 32)
        args = [t(b, h), t(b, h), t(b, h), t(4 * h, h) * 0.03, t(4 * h, h) * 0.03, t(4 * h),
                t(4 * h)]
        nbytes = sum(a.nbytes for a in args) + 2 * b * h * 4
        return example("lstm_cell").lstm_cell, args, nbytes, 1e-4
    raise KeyError(name)


def _measure_anchor(ctx, built) -> dict:
    fn, args, nbytes, tol = built
    bw = copy_bandwidth(ctx.out)
    with torch.no_grad():
        want = fn(*args)
        ind = compile_variant(fn, lambda f: f(*args), "inductor")
        loom = compile_variant(fn, lambda f: f(*args), "torchloom")
        match = matches(loom.fn(*args), want, tol, tol)
        inductor_match = matches(ind.fn(*args), want, tol, tol)
        ms = interleaved({name: (lambda f=f: gpu_ms(lambda: f(*args)))
                          for name, f in (("eager", fn), ("inductor", ind.fn),
                                          ("torchloom", loom.fn))}, ctx.rounds)
    us = {k: v * 1e3 for k, v in ms.items()}
    roofline_us = nbytes / bw * 1e6
    return {"eager_us": us["eager"], "inductor_us": us["inductor"],
            "torchloom_us": us["torchloom"],
            "speedup_vs_inductor": us["inductor"] / us["torchloom"],
            "roofline_us": roofline_us,
            "torchloom_pct_roofline": 100 * roofline_us / us["torchloom"],
            "inductor_pct_roofline": 100 * roofline_us / us["inductor"],
            "kernels_loom_inductor": [loom.kernels, ind.kernels],
            "compile_s_loom_inductor": [loom.compile_s, ind.compile_s],
            "codegens": list(loom.codegens), "match": match,
            "inductor_match": inductor_match, "notes": list(loom.notes[:3])}


def _anchor_row(name: str) -> Row:
    return Row(name, lambda device, full: _anchor(name, device, full),
               lambda built: built[0](*built[1]), _measure_anchor)


ANCHOR_NAMES = ("gelu_bookend", "transpose_bookend", "layer_norm", "softmax",
                "bias_gelu_bf16", "lstm_cell")
ANCHORS = Part(
    "anchors", "The seed workloads of the Triton codegen (benchmarks/gpu/test_triton_bench.py) "
    "at its sizes, inference: median us per call (triton.testing.do_bench, L2 flushed), "
    "interleaved rounds; roofline = compulsory bytes at the measured copy bandwidth.",
    90, 55,
    ("eager_us", "inductor_us", "torchloom_us", "speedup_vs_inductor", "roofline_us",
     "torchloom_pct_roofline", "inductor_pct_roofline", "kernels_loom_inductor",
     "compile_s_loom_inductor", "codegens", "match"),
    lambda quick: [_anchor_row(n) for n in ANCHOR_NAMES
                   if not quick or n in ("gelu_bookend", "layer_norm", "lstm_cell")])


# --- training steps against their compulsory bytes -----------------------------------

def _training(name: str, device: str, full: bool):
    """(model, input requiring grad)."""
    if name == "layer_norm_gelu_train":  # 8192 x 3072 on a GPU, 32 x 96 on the CPU
        model, [x] = example("layer_norm_gelu").workload(device="cuda" if full else "cpu")
        return model.to(device), x
    torch.manual_seed(0)
    rows, cols = (8192, 3072) if full else (32, 96)
    model = torch.nn.RMSNorm(cols).to(device)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
    return model, torch.randn(rows, cols, device=device, requires_grad=True)


def _smoke_training(built):
    model, x = built
    model(x).sum().backward()


def _measure_training(ctx, built) -> dict:
    model, x = built
    bw = copy_bandwidth(ctx.out)
    gy = torch.randn_like(x)
    out = model(x)
    out.backward(gy)
    want = (out.detach(), x.grad.clone(), [p.grad.clone() for p in model.parameters()])
    models = {"eager": model, "inductor": copy.deepcopy(model),
              "torchloom": copy.deepcopy(model)}

    def step(f):
        f(x).backward(gy)

    compiled = {b: compile_variant(models[b], step, b) for b in ("inductor", "torchloom")}
    loom, ind = compiled["torchloom"], compiled["inductor"]
    results = {}
    for b, v in compiled.items():
        x.grad = None
        for p in models[b].parameters():
            p.grad = None
        got = v.fn(x)
        got.backward(gy)
        results[b] = matches((got.detach(), x.grad, [p.grad for p in models[b].parameters()]),
                             want, 1e-3, 1e-4)
    fns = {"eager": model, "inductor": ind.fn, "torchloom": loom.fn}
    ms = interleaved({b: (lambda b=b: gpu_ms(
        lambda: step(fns[b]), grad_to_none=[x, *models[b].parameters()]))
        for b in fns}, ctx.rounds)
    us = {k: v * 1e3 for k, v in ms.items()}
    try:  # the project's byte model: each graph's inputs and outputs once, and per kernel
        from torchloom.report import kernel_summary
        summary = kernel_summary(loom.compiler)
        compulsory, moved, source = summary["bytes_compulsory"], summary["bytes_moved"], \
            "torchloom's graphs"
    except Exception as exc:  # forward reads x, writes y; backward reads dy, x, writes dx
        compulsory, moved, source = 5 * x.nbytes, None, f"5 x input bytes ({exc})"
    roofline_us = compulsory / bw * 1e6
    model_us = moved / bw * 1e6 if moved else None
    return {"eager_us": us["eager"], "inductor_us": us["inductor"],
            "torchloom_us": us["torchloom"],
            "speedup_vs_inductor": us["inductor"] / us["torchloom"],
            "compulsory_MB": compulsory / 1e6, "model_moved_MB": moved / 1e6 if moved else None,
            "roofline_us": roofline_us, "model_est_us": model_us,
            "torchloom_pct_roofline": 100 * roofline_us / us["torchloom"],
            "inductor_pct_roofline": 100 * roofline_us / us["inductor"],
            "measured_over_model": us["torchloom"] / model_us if model_us else None,
            "kernels_loom_inductor": [loom.kernels, ind.kernels],
            "compile_s_loom_inductor": [loom.compile_s, ind.compile_s],
            "codegens": list(loom.codegens), "match": results["torchloom"],
            "inductor_match": results["inductor"], "compulsory_from": source,
            "notes": list(loom.notes[:3])}


TRAINING = Part(
    "training", "Forward + backward on 8192 x 3072 f32 (a fixed upstream gradient; grads "
    "reset by do_bench): roofline = compulsory bytes (torchloom's graphs' inputs and outputs "
    "once) at the copy bandwidth; model_est = the bytes torchloom's kernels plan to move at "
    "that bandwidth; measured_over_model = how far the byte model is from the measured time.",
    50, 35,
    ("eager_us", "inductor_us", "torchloom_us", "speedup_vs_inductor", "compulsory_MB",
     "model_moved_MB", "roofline_us", "model_est_us", "torchloom_pct_roofline",
     "inductor_pct_roofline", "measured_over_model", "kernels_loom_inductor",
     "compile_s_loom_inductor", "match"),
    lambda quick: [Row(n, lambda device, full, n=n: _training(n, device, full),
                       _smoke_training, _measure_training)
                   for n in ("layer_norm_gelu_train", "rms_norm_train")
                   if not quick or n == "layer_norm_gelu_train"])


# --- CUDA-graph replay on small-batch models -----------------------------------------

class LSTMStep(torch.nn.Module):
    """One LSTM cell step of examples/lstm_cell.py, weights as parameters."""

    def __init__(self, inp: int, hidden: int):
        super().__init__()
        self.w_ih = torch.nn.Parameter(torch.randn(4 * hidden, inp) * 0.1)
        self.w_hh = torch.nn.Parameter(torch.randn(4 * hidden, hidden) * 0.1)
        self.b_ih = torch.nn.Parameter(torch.randn(4 * hidden) * 0.1)
        self.b_hh = torch.nn.Parameter(torch.randn(4 * hidden) * 0.1)
        self.cell = example("lstm_cell").lstm_cell

    def forward(self, x, hx, cx):
        return self.cell(x, hx, cx, self.w_ih, self.w_hh, self.b_ih, self.b_hh)


def _small_batch(name: str, device: str, full: bool):
    """(model, two input sets): inputs alternate call by call, as in a serving loop."""
    torch.manual_seed(0)
    if name == "mlp_batch1":
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 256), torch.nn.GELU(),
                                    torch.nn.Linear(256, 16))
        shapes = [(1, 256)]
    else:
        model, shapes = LSTMStep(128, 256), [(1, 128), (1, 256), (1, 256)]
    sets = [tuple(torch.randn(*s, device=device) * 0.1 for s in shapes) for _ in range(2)]
    return model.to(device).eval(), sets


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _measure_cudagraphs(ctx, built) -> dict:
    model, sets = built
    def warm(f):  # compile, warm up, record; no output kept alive (CUDA-graph pools)
        for i in range(6):
            f(*sets[i % 2])

    with torch.no_grad():
        want = [_first(model(*s)).clone() for s in sets]
        variants = {"inductor": compile_variant(model, warm, "inductor"),
                    "inductor_ro": compile_variant(model, warm, "inductor",
                                                   mode="reduce-overhead"),
                    "torchloom": compile_variant(model, warm, "torchloom"),
                    "torchloom_ro": compile_variant(model, warm, "torchloom",
                                                    mode="reduce-overhead")}
        fns = {"eager": model, **{k: v.fn for k, v in variants.items()}}
        match = {k: all(matches(_first(f(*s)).clone(), w, 1e-4, 1e-4) == "yes"
                        for s, w in zip(sets, want)) for k, f in fns.items()}
        for f in fns.values():
            warm(f)
        us = interleaved({k: (lambda f=f: wall_us(lambda i: f(*sets[i % 2]), 200))
                          for k, f in fns.items()}, ctx.rounds)
    loom_ro = variants["torchloom_ro"]
    return {**{f"{k}_us": v for k, v in us.items()},
            "ro_speedup_vs_inductor_ro": us["inductor_ro"] / us["torchloom_ro"],
            "cudagraphs_gain": us["torchloom"] / us["torchloom_ro"],
            "match": "yes" if all(match.values()) else
            "NO: " + ", ".join(k for k, ok in match.items() if not ok),
            "compile_s_loom_ro_inductor_ro": [loom_ro.compile_s,
                                              variants["inductor_ro"].compile_s],
            "notes": list(loom_ro.notes[:3])}


CUDAGRAPHS = Part(
    "cudagraphs", "CUDA-graph replay, batch 1, inference: wall us per call over 200 "
    "back-to-back calls (two input sets alternating; CPU overhead included), torchloom "
    "mode='reduce-overhead' (the cudagraphs plugin) against Inductor's; cudagraphs_gain = "
    "torchloom without / with CUDA graphs.",
    40, 30,
    ("eager_us", "inductor_us", "inductor_ro_us", "torchloom_us", "torchloom_ro_us",
     "ro_speedup_vs_inductor_ro", "cudagraphs_gain", "compile_s_loom_ro_inductor_ro",
     "match"),
    lambda quick: [Row(n, lambda device, full, n=n: _small_batch(n, device, full),
                       lambda built: built[0](*built[1][0]), _measure_cudagraphs)
                   for n in ("mlp_batch1", "lstm_step_batch1")
                   if not quick or n == "mlp_batch1"])
