"""Eager's CPU flash attention against the ``cpu`` codegen's blocked attention
(``torchloom_codegen_cpu/attention.py``), call by call, in one process: forward with a
``finfo.min`` causal mask (what Llama and Qwen2 pass), forward with a causal flag, backward
with the mask. Interleaved rounds, medians, ms.

    .venv/bin/python benchmarks/attention_calls.py [B H Hk L D] [--rounds 15] [--threads 2]

The default shape is the zoo's Llama layer: ``[1, 8, 512, 32]``, the query transposed out of
``[1, 512, 8, 32]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", nargs="*", type=int, default=[1, 8, 8, 512, 32],
                        help="B H Hk L D (default 1 8 8 512 32)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from torchloom_codegen_cpu.codegen import CpuCodegen
    torch.set_num_threads(args.threads)
    B, H, Hk, L, D = args.shape
    blocked = CpuCodegen(cache_dir=tempfile.mkdtemp(prefix="torchloom-attn-"))._attention
    if None in (blocked._loaded("forward"), blocked._loaded("backward")):
        raise SystemExit("the blocked attention is unavailable here (see the log)")
    q, go = (torch.randn(B, L, H, D).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(B, Hk, L, D) for _ in range(2))
    mask = torch.full((L, L), torch.finfo(torch.float32).min).triu(1)[None, None]
    out, lse = FORWARD(q, k, v, 0.0, False, attn_mask=mask)
    calls = {
        "forward, causal mask": (lambda: FORWARD(q, k, v, 0.0, False, attn_mask=mask),
                                 lambda: blocked.forward(q, k, v, 0.0, False, attn_mask=mask)),
        "forward, causal flag": (lambda: FORWARD(q, k, v, 0.0, True),
                                 lambda: blocked.forward(q, k, v, 0.0, True)),
        "backward, causal mask": (
            lambda: BACKWARD(go, q, k, v, out, lse, 0.0, False, attn_mask=mask),
            lambda: blocked.backward(go, q, k, v, out, lse, 0.0, False, attn_mask=mask)),
    }
    print(f"[{B}, {H}, {L}, {D}], {Hk} key heads, {args.threads} threads, "
          f"{args.rounds} rounds")
    print("| call | eager ms | torchloom ms | speed-up |\n| --- | --- | --- | --- |")
    for name, sides in calls.items():
        times: list[list[float]] = [[], []]
        for fn in sides:
            fn()
        for _ in range(args.rounds):
            for i, fn in enumerate(sides):
                start = time.perf_counter()
                fn()
                times[i].append((time.perf_counter() - start) * 1e3)
        eager, ours = (statistics.median(t) for t in times)
        print(f"| {name} | {eager:.2f} | {ours:.2f} | {eager / ours:.2f}x |")


if __name__ == "__main__":
    main()
