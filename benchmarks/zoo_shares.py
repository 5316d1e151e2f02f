"""How much of each zoo row a compiler could ever change: the share of a step spent in
work every side runs alike (issue 41's bound).

GEMMs (``mm``, ``addmm``, ``bmm``, convolutions and their backward), attention (SDPA and its
backward) and, in training rows, the AdamW step (eager's ``foreach`` ops on every side) and
``zero_grad`` are library calls that eager, Inductor and torchloom make with the same
shapes and layouts (measured call for call for Llama: RESULTS.md, issue 41). A compiler
that made everything else free would run a step in that time, so

    bound (vs the side profiled) = step time / shared time

is the most any compiler calling the same libraries can gain over that side. Each row is
profiled on the side named (default Inductor) with torch.profiler after warm-up steps; the
op self times are summed per class and divided by the wall time of the profiled steps
(the profiler's overhead inflates the step, so the bound printed is above the real one).

    .venv/bin/python benchmarks/zoo_shares.py --models llama gpt2 --modes train infer
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import model_zoo  # noqa: E402

#: op names (torch.profiler keys, without ``aten::``) each side runs as the same library call
GEMM = ("mm", "addmm", "bmm", "baddbmm", "mkldnn_convolution", "convolution_backward",
        "_mkldnn_convolution", "mkldnn_convolution_backward", "_convolution",
        "convolution_overrideable", "_linear_pointwise", "_convolution_pointwise")
ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention_for_cpu_backward",
             "_scaled_dot_product_attention_math", "_flash_attention_forward",
             "_flash_attention_backward")


def classify(key: str) -> str:
    name = key.split("::", 1)[-1]
    if name in GEMM:
        return "gemm"
    if name in ATTENTION:
        return "attention"
    return "other"


def profile_row(model: str, mode: str, side: str, steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as root:
        s = model_zoo.make_side(model, mode, side, Path(root))
        for _ in range(warmup):
            s.step()
        walls = []
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                start = time.perf_counter()
                s.step()
                walls.append(time.perf_counter() - start)
        torch._dynamo.reset()
    shares = {"gemm": 0.0, "attention": 0.0, "optimizer": 0.0, "other": 0.0}
    # the optimizer's share is its record_functions' inclusive time; its aten ops (sqrt,
    # lerp_, addcdiv_) are also listed among the largest others, which are only shown
    others = []
    for event in prof.key_averages():
        if event.key.startswith("Optimizer."):  # step and zero_grad, all they call
            shares["optimizer"] += event.cpu_time_total / 1e6
        elif event.key.startswith("aten::") or event.key.startswith("mkldnn::"):
            kind = classify(event.key)
            shares[kind] += event.self_cpu_time_total / 1e6
            if kind == "other":
                others.append((event.self_cpu_time_total / 1e3 / steps, event.key))
    wall = sum(walls)
    shared = shares["gemm"] + shares["attention"] + shares["optimizer"]
    return {"model": model, "mode": mode, "step_ms": 1e3 * statistics.median(walls),
            **{k: v / wall for k, v in shares.items() if k != "other"},
            "shared": shared / wall, "bound": wall / shared if shared else math.inf,
            "walls_ms": [round(1e3 * w, 1) for w in walls],
            "top_other": [f"{k.split('::')[-1]} {ms:.1f}" for ms, k in sorted(others)[::-1][:4]]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(model_zoo.ZOO),
                        default=list(model_zoo.ZOO))
    parser.add_argument("--modes", nargs="+", choices=("train", "infer"),
                        default=["train", "infer"])
    parser.add_argument("--side", choices=model_zoo.SIDES, default="inductor")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"| model | row | {args.side} step ms (profiled) | GEMM | attention | optimizer "
          f"| shared | bound vs {args.side} | largest other aten ops (ms a step) |\n"
          f"| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
          flush=True)
    bounds = []
    for model, mode in model_zoo.rows(args.models, args.modes):
        r = profile_row(model, mode, args.side, args.steps, args.warmup)
        bounds.append(r["bound"])
        print(f"| {model_zoo.ZOO[model].title} | {mode} | {r['step_ms']:.1f} | "
              f"{r['gemm']:.0%} | {r['attention']:.0%} | {r['optimizer']:.0%} | "
              f"{r['shared']:.0%} | {r['bound']:.2f} | {', '.join(r['top_other'])} |",
              flush=True)
        print(f"  (steps ms: {r['walls_ms']})", file=sys.stderr, flush=True)
    geomean = math.exp(sum(map(math.log, bounds)) / len(bounds))
    print(f"\ngeomean bound over {len(bounds)} rows: {geomean:.3f}x {args.side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
