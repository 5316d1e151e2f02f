"""Replay recorded groups through the codegens of one source tree: each group's supports()
reason, and its source and metadata (cpu: ``write_function``; triton and scalar_c, the core's
lowering rendered by examples/third_party_codegen: ``generate``), or the exception, as JSON
lines.

    python benchmarks/replay/replay.py TREE groups.jsonl out.jsonl

TREE is a checkout (a ``git archive`` copy of another commit, or the working tree): its
``core``, the two codegens' ``src`` and scalar_c's go first on ``sys.path``."""

import json
import os
import sys
import traceback


def _where(exc: BaseException) -> list[str]:
    return [f"{f.filename.split('/')[-1]}:{f.lineno}"
            for f in traceback.extract_tb(exc.__traceback__)][-3:]


def main(tree: str, groups: str, out_path: str) -> None:
    for sub in ("examples/third_party_codegen/src", "plugins/codegen_triton/src",
                "plugins/codegen_cpu/src", "core"):
        sys.path.insert(0, os.path.join(tree, sub))
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torchloom
    from torchloom.api import RendererCodegen
    from torchloom.ir.text import parse_graph
    from torchloom.ops.aten import default_registry
    from torchloom_codegen_cpu.codegen import CpuCodegen
    from torchloom_codegen_cpu.function import write_function
    from torchloom_codegen_triton.codegen import TritonCodegen
    from torchloom_scalar_c.renderer import ScalarC

    print("torchloom from", torchloom.__file__, file=sys.stderr)
    registry = default_registry()
    codegens = {"cpu": CpuCodegen(), "triton": TritonCodegen(),
                "scalar_c": RendererCodegen(ScalarC())}
    seen = set()
    with open(out_path, "w") as out:
        for line in open(groups):
            rec = json.loads(line)
            key = (rec["codegen"], rec["index"], rec["text"])
            if key in seen:
                continue
            seen.add(key)
            res = {"codegen": rec["codegen"], "index": rec["index"], "text": rec["text"]}
            node = list(parse_graph(rec["text"]).nodes)[rec["index"]]
            codegen = codegens[rec["codegen"]]
            try:
                reason = codegen.supports(node, registry)
                res["reason"] = None if reason is None else str(reason)
            except Exception as exc:
                res["reason_exc"], res["where"] = f"{type(exc).__name__}: {exc}", _where(exc)
            try:
                if rec["codegen"] == "cpu":
                    res["source"], meta = write_function(node, registry)
                else:
                    kernel = codegen.generate(node, registry)
                    res["source"], meta = kernel.source, kernel.metadata
                res["metadata"] = json.loads(json.dumps(meta, default=str))
            except Exception as exc:
                res["error"], res["where"] = f"{type(exc).__name__}: {exc}", _where(exc)
            out.write(json.dumps(res) + "\n")
    print(len(seen), "groups", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:4])
