"""The kernel cache's disk layer: a warm cache compiles nothing in a second process,
broken entries are reported and regenerated, concurrent writers never break an entry."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import torch

from torchloom.api import KernelSource, parse_graph
from torchloom.runtime.cache import KernelCache, checksum, _read_entry

from dedup_helpers import CountingCodegen, compiler

HERE = Path(__file__).resolve().parent

TWO_KINDS = """\
graph @two(%x: f32[4, 8], %y: f32[4, 8]) {
  %a = torchloom.fusion_group(%x, %y) : f32[4, 8] region @g0(%p: f32[4, 8], %q: f32[4, 8]) {
    %s = aten.mul.Tensor(%p, %q) : f32[4, 8]
    %t = aten.tanh.default(%s) : f32[4, 8]
    return %t
  }
  %b = torchloom.fusion_group(%a, %y) : f32[4, 8] region @g1(%i: f32[4, 8], %j: f32[4, 8]) {
    %m = aten.mul.Tensor(%i, %j) : f32[4, 8]
    %n = aten.tanh.default(%m) : f32[4, 8]
    return %n
  }
  %c = torchloom.fusion_group(%b) : f32[4] region @g2(%u: f32[4, 8]) {
    %r = aten.sum.dim_IntList(%u) {dim = [-1]} : f32[4]
    return %r
  }
  return %c
}
"""

SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {here!r})
import torch
from torchloom.api import parse_graph
from dedup_helpers import CountingCodegen, compiler
codegen = CountingCodegen()
comp = compiler(Path(sys.argv[1]), ["dedup.kernels"], codegen, cache_dir=Path(sys.argv[2]))
result = comp.compile_graph(parse_graph(sys.argv[3]))
x, y = torch.randn(4, 8), torch.randn(4, 8)
error = (result.fn(x, y)[0] - torch.tanh(torch.tanh(x * y) * y).sum(-1)).abs().max().item()
print(json.dumps({{"generated": codegen.generated, "error": error,
                  **comp.kernel_cache.stats()}}))
"""


def _eager(x, y):
    return torch.tanh(torch.tanh(x * y) * y).sum(-1)


def _run_process(workdir: Path, cache: Path) -> dict:
    workdir.mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(here=str(HERE)), str(workdir),
                          str(cache), TWO_KINDS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_with_warm_disk_cache_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    first = CountingCodegen()  # this process warms the cache
    comp = compiler(tmp_path, ["dedup.kernels"], first, cache)
    comp.compile_graph(parse_graph(TWO_KINDS))
    assert (first.generated, comp.kernel_cache.disk_hits) == (2, 0)
    second = _run_process(tmp_path / "second", cache)
    assert (second["generated"], second["disk_hits"], second["hits"]) == (0, 2, 1)
    assert second["error"] < 1e-5
    assert second["saved_ms_estimate"] > 0  # the entries remember their compile time
    assert len(list((cache / "kernels").glob("*.json"))) == 2
    assert len(list((cache / "kernels").glob("*.src"))) == 2


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "kernels").glob("*.json"))


def test_corrupted_entries_are_reported_once_and_regenerated(tmp_path, caplog):
    cache = tmp_path / "cache"
    compiler(tmp_path, ["dedup.kernels"], CountingCodegen(), cache).compile_graph(
        parse_graph(TWO_KINDS))
    truncated, tampered = _entries(cache)
    truncated.write_text(truncated.read_text()[:40])
    source = cache / "kernels" / json.loads(tampered.read_text())["source_file"]
    source.write_text(source.read_text() + "\n")  # one byte more than its checksum covers

    codegen = CountingCodegen()
    with caplog.at_level(logging.WARNING, logger="torchloom.cache"):
        comp = compiler(tmp_path, ["dedup.kernels"], codegen, cache)
        result = comp.compile_graph(parse_graph(TWO_KINDS))
        comp.compile_graph(parse_graph(TWO_KINDS))  # memory hits: nothing more to report
    warnings = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(warnings) == 2
    assert any(truncated.name in w for w in warnings) and any(tampered.name in w
                                                              for w in warnings)
    assert codegen.generated == 2 and comp.kernel_cache.corrupt == 2
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(result.fn(x, y)[0], _eager(x, y))

    healed = CountingCodegen()  # the entries were rewritten: a third compiler loads them
    comp = compiler(tmp_path, ["dedup.kernels"], healed, cache)
    result = comp.compile_graph(parse_graph(TWO_KINDS))
    assert (healed.generated, comp.kernel_cache.disk_hits) == (0, 2)
    torch.testing.assert_close(result.fn(x, y)[0], _eager(x, y))


def test_pipeline_fingerprint_and_codegen_version_are_part_of_the_key(tmp_path):
    cache = tmp_path / "cache"
    compiler(tmp_path, ["dedup.kernels"], CountingCodegen(), cache).compile_graph(
        parse_graph(TWO_KINDS))
    other_pipeline = CountingCodegen()
    compiler(tmp_path, ["dedup.kernels", "dce"], other_pipeline, cache).compile_graph(
        parse_graph(TWO_KINDS))
    bumped = CountingCodegen()
    bumped.version = "2"
    compiler(tmp_path, ["dedup.kernels"], bumped, cache).compile_graph(parse_graph(TWO_KINDS))
    same = CountingCodegen()
    compiler(tmp_path, ["dedup.kernels"], same, cache).compile_graph(parse_graph(TWO_KINDS))
    assert (other_pipeline.generated, bumped.generated, same.generated) == (2, 2, 0)


def test_concurrent_writers_never_leave_a_broken_entry(tmp_path):
    codegen = CountingCodegen()
    group = parse_graph(TWO_KINDS).first
    writers = [KernelCache(tmp_path, "fp") for _ in range(4)]
    entry = writers[0]._entry(codegen, writers[0].key(codegen, group))
    meta = entry.with_suffix(".json")
    errors: list[str] = []
    reads = [0]
    stop = threading.Event()

    def write(cache: KernelCache, n: int) -> None:
        for i in range(40):  # different sources too: each names its own source file
            cache._store(entry, cache.key(codegen, group),
                         KernelSource(codegen.name, f"source {n} {i}\n" * 200, {"i": i}))

    def read() -> None:
        while not stop.is_set():
            if meta.exists():
                try:
                    _read_entry(meta, codegen)
                    reads[0] += 1
                except Exception as exc:  # noqa: BLE001 - any failure is the bug
                    errors.append(repr(exc))

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(c, n)) for n, c in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    assert errors == [] and reads[0] > 0
    assert _read_entry(meta, codegen)[0].source.startswith("source ")
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


def test_metadata_that_is_not_json_stays_in_memory(tmp_path):
    class Opaque(CountingCodegen):
        def generate(self, group, registry):
            kernel = super().generate(group, registry)
            return KernelSource(kernel.codegen, kernel.source, {"fn": object()})

    cache = KernelCache(tmp_path, "fp")
    codegen = Opaque()
    graph = parse_graph(TWO_KINDS)
    from torchloom.tools import load_plugins
    registry = load_plugins().registry
    kernel = cache.get_or_compile(codegen, graph.first, registry)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(kernel(x, y)[0], torch.tanh(x * y))
    assert list(tmp_path.iterdir()) == [] and codegen.generated == 1


def test_entries_of_another_format_version_are_a_silent_miss(tmp_path, caplog):
    cache = tmp_path / "cache"
    compiler(tmp_path, ["dedup.kernels"], CountingCodegen(), cache).compile_graph(
        parse_graph(TWO_KINDS))
    for meta in _entries(cache):  # what an older torchloom wrote (checksum and all)
        data = json.loads(meta.read_text())
        data.pop("checksum")
        data["format"] = 1
        meta.write_text(json.dumps({**data, "checksum": checksum(data)}))
    codegen = CountingCodegen()
    with caplog.at_level(logging.WARNING, logger="torchloom.cache"):
        comp = compiler(tmp_path, ["dedup.kernels"], codegen, cache)
        comp.compile_graph(parse_graph(TWO_KINDS))
    assert codegen.generated == 2 and comp.kernel_cache.corrupt == 0
    assert not [r for r in caplog.records if "corrupt" in r.getMessage()]
    assert all(json.loads(m.read_text())["format"] != 1 for m in _entries(cache))
