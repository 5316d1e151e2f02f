"""pytest plugin: record every group a native codegen's ``supports()`` sees (its graph's
text and the group's index in it), once per process, as JSON lines appended to
``$TORCHLOOM_REPLAY_OUT``. Usage: README.md beside this file."""

from __future__ import annotations

import hashlib
import json
import os


class _Recorder:
    def __init__(self, path: str):
        self.path = path
        self.seen: set[str] = set()

    def record(self, codegen: str, group) -> None:
        from torchloom.ir.printer import print_graph
        nodes = list(group.graph.nodes)
        if group not in nodes:
            return
        text = print_graph(group.graph)
        index = nodes.index(group)
        key = hashlib.sha1(f"{codegen}\n{index}\n{text}".encode()).hexdigest()
        if key in self.seen:
            return
        self.seen.add(key)
        with open(self.path, "a") as f:
            f.write(json.dumps({"codegen": codegen, "index": index, "text": text}) + "\n")

    def wrap(self, cls, codegen: str) -> None:
        supports = cls.supports

        def recording(codegen_self, group, registry):
            self.record(codegen, group)
            return supports(codegen_self, group, registry)
        cls.supports = recording


def pytest_configure(config):
    recorder = _Recorder(os.environ.get("TORCHLOOM_REPLAY_OUT", "groups.jsonl"))
    from torchloom_codegen_cpu.codegen import CpuCodegen
    from torchloom_codegen_triton.codegen import TritonCodegen
    recorder.wrap(CpuCodegen, "cpu")
    recorder.wrap(TritonCodegen, "triton")
