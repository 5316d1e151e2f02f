"""torchloom under torch.distributed: DDP (with Dynamo's graph split at bucket boundaries),
FSDP2 (``fully_shard``) and functional collectives inside a compiled graph.

Two ranks (gloo, CPU) are spawned once for the module; each rank trains every model for a
few optimizer steps in eager and then compiled with ``backend="torchloom"``, from the same
initial weights and inputs, and saves losses, outputs and gradients. The tests compare them
with ``assert_close`` and count what torchloom compiled (graphs, fusion groups, no graph
run eagerly instead)."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
import warnings
from pathlib import Path

import pytest
import torch

STEPS = 3
WORLD = 2
TIMEOUT_S = 240  # a hung collective fails the test instead of blocking CI


class Block(torch.nn.Module):
    """~1 MiB of parameters: with ``bucket_cap_mb=1`` each block fills a DDP bucket."""

    def __init__(self, dim: int = 256, hidden: int = 512):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def make_model(blocks: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(blocks)], torch.nn.Linear(256, 8))


def _local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def _train(model, fn, rank: int) -> dict:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], []
    for step in range(STEPS):
        x = torch.randn(16, 256, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = fn(x).square().mean()
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append([_local(p.grad) for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return {"losses": losses, "grads": grads, "params": [_local(p) for p in model.parameters()]}


def _structure(compiler) -> dict:
    return {"graphs": len(compiler.compilations),
            "fallbacks": [c.fallback_reason for c in compiler.compilations
                          if c.fallback_reason is not None],
            "fusion_groups": sum(1 for c in compiler.compilations if c.graph is not None
                                 for n in c.graph.nodes if n.op == "torchloom.fusion_group")}


def _ddp(rank: int, cache: str) -> tuple[dict, dict, dict]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from torchloom.compiler import Compiler
    eager = DDP(make_model(3), bucket_cap_mb=1)
    ref = _train(eager, eager, rank)
    model = make_model(3)
    compiler = Compiler("default", cache_dir=cache)
    # the compiled module under DDP: Dynamo's DDPOptimizer splits its graph per bucket
    ddp = DDP(torch.compile(model, backend="torchloom", options={"compiler": compiler}),
              bucket_cap_mb=1)
    return ref, _train(model, ddp, rank), _structure(compiler)


def _fsdp(rank: int, cache: str) -> tuple[dict, dict, dict]:
    from torch.distributed.fsdp import fully_shard

    from torchloom.compiler import Compiler
    runs = []
    for compiled in (False, True):
        model = make_model(2)
        for block in model[:2]:
            fully_shard(block)
        fully_shard(model)
        compiler = Compiler("default", cache_dir=cache)
        fn = torch.compile(model, backend="torchloom",
                           options={"compiler": compiler}) if compiled else model
        runs.append(_train(model, fn, rank))
    return runs[0], runs[1], _structure(compiler)


def _collectives_fn(x, w):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD
    y = fc.all_reduce(torch.nn.functional.gelu(x @ w), "sum", group)
    z = fc.all_gather_single(y * 2, 0, group)  # [WORLD * 8, 16]
    s = fc.reduce_scatter_single(z.sin() + 1, "sum", 0, group)  # back to [8, 16]
    return (s * y).tanh()


def _collectives(rank: int, cache: str) -> tuple[dict, dict, dict]:
    from torchloom.compiler import Compiler
    compiler = Compiler("default", cache_dir=cache)
    compiled = torch.compile(_collectives_fn, backend="torchloom",
                             options={"compiler": compiler})
    runs = []
    for fn in (_collectives_fn, compiled):
        g = torch.Generator().manual_seed(rank)
        # values of order 1: sin and tanh of large ones would magnify rounding
        x = (0.5 * torch.randn(8, 16, generator=g)).requires_grad_()
        w = (0.25 * torch.randn(16, 16, generator=g)).requires_grad_()
        out = fn(x, w)
        out.square().sum().backward()
        runs.append({"losses": [out.detach()], "grads": [[x.grad, w.grad]], "params": []})
    return runs[0], runs[1], _structure(compiler)


SCENARIOS = {"ddp": _ddp, "fsdp": _fsdp, "collectives": _collectives}


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)  # two ranks on a shared machine
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S // 2))
    try:
        for name, scenario in SCENARIOS.items():
            ref, got, structure = scenario(rank, str(Path(out) / f"cache{rank}"))
            torch.save({"eager": ref, "torchloom": got}, Path(out) / f"{name}-{rank}.pt")
            (Path(out) / f"{name}-{rank}.json").write_text(json.dumps(structure))
    except BaseException:  # kept: a rank aborting in gloo's teardown loses the traceback
        import traceback
        (Path(out) / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    import torch.multiprocessing as mp
    out = tmp_path_factory.mktemp("distributed")
    ctx = mp.start_processes(_worker, args=(_free_port(), str(out)), nprocs=WORLD,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} ranks did not finish in {TIMEOUT_S} s (a hang)")
    except Exception as exc:  # name what a rank raised before it died
        errors = "\n".join(p.read_text() for p in sorted(out.glob("error-*.txt")))
        done = all((out / f"{name}-{rank}.{ext}").exists() for name in SCENARIOS
                   for rank in range(WORLD) for ext in ("pt", "json"))
        if errors or not done:
            raise AssertionError(f"{exc}\n{errors or 'no rank recorded a Python error'}") \
                from exc
        # every rank wrote all its results, then died in gloo's teardown (seen in clean-clone
        # CI runs only: SIGABRT, "terminate called without an active exception"; an open
        # bug named in the issue notes): the results are still checked below
        warnings.warn(f"a rank died after writing all its results: {exc}")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return out


def _load(runs: Path, name: str, rank: int) -> tuple[dict, dict]:
    data = torch.load(runs / f"{name}-{rank}.pt", weights_only=True)
    return data, json.loads((runs / f"{name}-{rank}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("rank", range(WORLD))
def test_training_matches_eager(runs, name, rank):
    data, _ = _load(runs, name, rank)
    eager, got = data["eager"], data["torchloom"]
    torch.testing.assert_close(got["losses"], eager["losses"])
    assert len(got["grads"]) == len(eager["grads"]) and got["grads"][0]
    for step, (g, e) in enumerate(zip(got["grads"], eager["grads"])):
        torch.testing.assert_close(g, e, msg=lambda m: f"step {step}: {m}")
    torch.testing.assert_close(got["params"], eager["params"])


@pytest.mark.parametrize("rank", range(WORLD))
def test_ddp_graph_is_split_and_compiled(runs, rank):
    _, structure = _load(runs, "ddp", rank)
    _, whole = _load(runs, "collectives", rank)
    assert structure["fallbacks"] == []
    # three ~1 MiB blocks in 1 MiB buckets: at least two Dynamo graphs, each compiled
    # forward and backward by torchloom
    assert structure["graphs"] >= 4 and structure["graphs"] % 2 == 0
    assert structure["fusion_groups"] >= structure["graphs"]
    assert whole["graphs"] == 2  # one unsplit graph (no DDP): forward and backward


@pytest.mark.parametrize("name", ["fsdp", "collectives"])
@pytest.mark.parametrize("rank", range(WORLD))
def test_graphs_compiled_without_fallback(runs, name, rank):
    _, structure = _load(runs, name, rank)
    assert structure["fallbacks"] == []
    assert structure["graphs"] >= 2 and structure["fusion_groups"] >= 2
