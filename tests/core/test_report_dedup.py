"""``explain``'s ``dedup`` summary adds up what passes report through
``PassResult.deduplication``, whichever pass that is: the core names no plugin's pass."""

from __future__ import annotations

import json
from types import SimpleNamespace

import attrs
import pytest

from torchloom.ir.text import parse_graph
from torchloom.passes.base import Deduplication, PassResult
from torchloom.passes.manager import _as_data, _merge
from torchloom.report import dedup_summary
from torchloom.runtime.records import PassRecord, RunReport

GRAPH = """\
graph @g(%x: f32[4]) {
  %a = aten.exp.default(%x) : f32[4]
  %b = aten.neg.default(%a) : f32[4]
  return %b
}
"""


def compilation(records):
    return SimpleNamespace(report=RunReport(records), graph=parse_graph(GRAPH))


def test_any_pass_reporting_deduplication_is_summed_and_names_do_not_matter():
    share = PassRecord("example.share", 1.0, True, {}, "example",
                       deduplication=_as_data(Deduplication(regions=1, occurrences=3,
                                                            nodes_deduplicated=10)))
    later = PassRecord("example.later", 4.0, False, {}, "example")
    # named like the dedup plugin's pass, with its counters, but reporting nothing
    impostor = PassRecord("dedup.regions", 2.0, True,
                          {"regions": 5, "occurrences": 9, "nodes_deduplicated": 50}, "x")
    comps = [compilation([share, later]), compilation([impostor, later])]
    summary = dedup_summary(comps, {}, groups=0)
    assert (summary["regions"], summary["occurrences_replaced"],
            summary["nodes_deduplicated"]) == (1, 3, 10)
    # the 4 ms after the sharing pass, scaled by the 10 nodes it spared the 2 it left
    assert summary["compile_ms_saved_estimate"] == pytest.approx(4.0 * 10 / 2)


def test_two_reporting_passes_in_one_graph_each_count():
    first = PassRecord("a.share", 1.0, True, {}, "a",
                       deduplication=_as_data(Deduplication(1, 2, 4)))
    second = PassRecord("b.share", 1.0, True, {}, "b",
                        deduplication=_as_data(Deduplication(2, 5, 6)))
    summary = dedup_summary([compilation([first, second])], {}, groups=0)
    assert (summary["regions"], summary["occurrences_replaced"],
            summary["nodes_deduplicated"]) == (3, 7, 10)


def test_record_round_trips_through_the_compile_caches_json():
    record = PassRecord("a.share", 1.5, True, {"regions": 1}, "a",
                        deduplication=_as_data(Deduplication(1, 2, 3)))
    back = PassRecord(**json.loads(json.dumps(attrs.asdict(record))))
    assert back == record
    plain = PassRecord("a.other", 1.5, False, {}, "a")
    assert PassRecord(**json.loads(json.dumps(attrs.asdict(plain)))).deduplication is None


def test_a_pass_run_on_shared_subgraphs_reports_the_sum():
    main = PassResult(True, {"n": 1}, Deduplication(1, 2, 3))
    sub = PassResult(False, {"n": 2}, Deduplication(0, 1, 1))
    assert _merge(main, sub) == PassResult(True, {"n": 3}, Deduplication(1, 3, 4))
    assert _merge(PassResult(False), sub).deduplication == Deduplication(0, 1, 1)
    assert _merge(PassResult(False), PassResult(True)).deduplication is None
