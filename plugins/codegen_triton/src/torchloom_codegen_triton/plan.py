"""Block configurations for the kernel writer.

``reduction_configs`` lists the candidate ``XBLOCK``/``RBLOCK``/``num_warps`` of a reduction
kernel (the first is the default; a GPU autotunes over them).
"""

from __future__ import annotations

from torchloom.api import row_forms

next_pow2 = row_forms.next_pow2


def representative(dim, default: int) -> int:
    """``dim`` when it is an int; ``default`` for a symbolic size (the plan of a kernel
    whose sizes come at launch, shown by ``explain`` and built by ``--target``)."""
    return dim if isinstance(dim, int) else default


def pointwise_configs(numel: int) -> list[dict[str, int]]:
    """Candidate blocks of a pointwise kernel over ``numel`` elements (default first)."""
    return [{"XBLOCK": b, "num_warps": w} for b, w in ((1024, 4), (512, 4), (2048, 8), (256, 4))
            if b <= max(next_pow2(numel), 256)] or [{"XBLOCK": 256, "num_warps": 4}]


def reduction_configs(rows: int, rnumel: int, looped: bool, max_persistent: int,
                       columns: bool = False, limit: int | None = 4) -> list[dict[str, int]]:
    if columns and looped:  # tiles of many rows (contiguous in memory) x a short chunk
        xmax = next_pow2(max(rows, 1))
        return [{"XBLOCK": min(x, xmax), "RBLOCK": min(r, next_pow2(max_persistent)),
                 "num_warps": w} for x, r, w in ((64, 32, 4), (128, 16, 8), (32, 64, 4))]
    if looped:  # chunks no longer than a persistent row
        return [{"XBLOCK": 1, "RBLOCK": r, "num_warps": w}
                for r, w in ((2048, 8), (1024, 4), (4096, 16)) if r <= max_persistent] or [
                    {"XBLOCK": 1, "RBLOCK": next_pow2(max_persistent), "num_warps": 4}]
    rblock = next_pow2(max(rnumel, 1))
    configs = []
    for xblock in (1, 2, 4, 8, 16, 32, 64):
        if xblock * rblock > 8192 or xblock > next_pow2(max(rows, 1)):
            continue
        size = xblock * rblock
        for warps in ((8, 16) if size >= 4096 else (4, 8) if size >= 1024 else (4,)):
            configs.append({"XBLOCK": xblock, "RBLOCK": rblock, "num_warps": warps})
    # the default first: about 2048 elements per program (a few short rows, or one long one)
    configs.sort(key=lambda c: (abs(c["XBLOCK"] * rblock - 2048), c["num_warps"]))
    return configs[:limit] or [{"XBLOCK": 1, "RBLOCK": rblock, "num_warps": 8}]


def wider_configs(meta: dict, max_persistent: int) -> list[dict[str, int]]:
    """``max-autotune``'s search: the kernel's own candidates (its default first), then
    every other launch a pointwise kernel or a persistent reduction can take (a block of
    128 to 4096 elements, 2 to 16 warps; every XBLOCK with the row's RBLOCK). Other forms
    keep their candidates: their blocks are tied to the plan."""
    own = list(meta["configs"])
    if meta.get("form") == "pointwise":
        top = max(next_pow2(meta["numel"]), 256)
        more = [{"XBLOCK": b, "num_warps": w} for b in (128, 256, 512, 1024, 2048, 4096)
                for w in (2, 4, 8, 16) if b <= top and 32 * w <= b]
    elif meta.get("form") == "persistent reduction":
        more = reduction_configs(meta["rows"], meta["rnumel"], False, max_persistent,
                                 limit=None)
    else:
        return own
    return own + [c for c in more if c not in own]
