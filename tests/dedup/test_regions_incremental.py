"""``dedup.regions`` scans the graph once, not once per region it extracts: after an
extraction it updates its node list, tokens, written values and graph outputs at the
windows only, and takes the next region from the last search's candidates that the
extraction left untouched before it searches again. Checked by counting the nodes it
tokenizes, and by comparing one run that extracts k regions with k runs that extract one
region each (each a fresh scan and search)."""

from __future__ import annotations

import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchloom_dedup.scan as scan
from torchloom.api import CALL_SUBGRAPH, Graph, PassContext, TensorType, print_graph, verify
from torchloom.tools import build_function, load_plugins
from torchloom_dedup.regions import DedupRegions

from test_regions_random import BINARY, UNARY, T, step  # its random block steps

REGISTRY = load_plugins().registry
CHAIN = ["aten.tanh.default", "aten.exp.default", "aten.neg.default", "aten.sigmoid.default",
         "aten.relu.default", "aten.abs.default", "aten.sin.default", "aten.cos.default"]


def _ctx() -> PassContext:
    return PassContext(registry=REGISTRY)


def blocks_graph(kinds: int, filler: int) -> Graph:
    """``kinds`` different 8-op blocks (each on its own shape, so no two match), each
    applied k + 2 times in a row (each time to the previous result; anchors are
    tried one per occurrence count), after a chain of ``filler``
    adds that repeats nothing worth a region."""
    g = Graph("blocks")
    y = g.add_input(TensorType.make((64, 8), torch.float32, "cpu"), "y")
    acc, outs = y, []
    for _ in range(filler):
        acc = g.create("aten.add.Tensor", [acc, y], [y.type]).output
    outs.append(acc)
    carry = []
    for k in range(kinds):
        carry.append(g.add_input(TensorType.make((k + 1, 8), torch.float32, "cpu"), f"x{k}"))
    for k in range(kinds):
        for _ in range(k + 2):
            for op in CHAIN:
                carry[k] = g.create(op, [carry[k]], [carry[k].type]).output
    g.set_outputs([*outs, *carry])
    return g


def test_nodes_tokenized_and_searches_grow_with_the_graph_not_with_the_regions(monkeypatch):
    tokenized, scans, searches = [0], [0], [0]
    token, mutated_values = scan.Tokenizer.token, scan.mutated_values
    candidates = DedupRegions._candidates

    def counting_candidates(self, tokens):
        searches[0] += 1
        return candidates(self, tokens)

    def counting_token(self, node, i):
        tokenized[0] += 1
        return token(self, node, i)

    def counting_mutated_values(graph, registry):
        scans[0] += 1
        return mutated_values(graph, registry)

    monkeypatch.setattr(scan.Tokenizer, "token", counting_token)
    monkeypatch.setattr(scan, "mutated_values", counting_mutated_values)
    monkeypatch.setattr(DedupRegions, "_candidates", counting_candidates)
    for kinds in (1, 2, 4):
        for filler in (200, 1000):
            graph = blocks_graph(kinds, filler)
            nodes = len(graph)
            tokenized[0] = scans[0] = searches[0] = 0
            result = DedupRegions(max_regions=4).run(graph, _ctx())
            verify(graph, REGISTRY)
            assert result.stats["regions"] == kinds
            calls = sum(n.op == CALL_SUBGRAPH for n in graph.nodes)
            assert calls == sum(k + 2 for k in range(kinds))
            # every node once, and each call it makes: not a rescan per region
            assert tokenized[0] == nodes + calls, (kinds, filler)
            assert scans[0] == 1
            # one search finds every block's candidate; the regions after the first
            # come from it, and a last search (when fewer than max_regions) finds none
            assert searches[0] == 1 + (kinds < 4), (kinds, filler, searches)


block = st.lists(step, min_size=2, max_size=6)


def build(blocks, order, writes) -> Graph:
    """Copies of several random blocks in the given order, each on the previous copy's
    result; after the copies listed in ``writes`` an in-place op writes the copy's
    result, which the next copy reads (a region reading it must be skipped, also once
    an earlier extraction made it a call's result)."""
    g = Graph("random")
    x, w = g.add_input(T, "x"), g.add_input(T, "w")
    carry, outs = x, []
    for c, b in enumerate(order):
        values = [carry, w]
        for op, picks in blocks[b % len(blocks)]:
            values.append(g.create(op, [values[p % len(values)] for p in picks], [T]).output)
        carry = values[-1]
        outs.append(values[len(values) // 2])
        if c in writes:
            g.create("aten.mul_.Tensor", [carry, w], [T])
    g.set_outputs([carry, *outs])
    return g


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.lists(block, min_size=1, max_size=3),
       order=st.lists(st.integers(0, 2), min_size=2, max_size=12),
       writes=st.sets(st.integers(0, 11), max_size=3), max_regions=st.integers(2, 4))
def test_one_run_extracts_valid_regions(blocks, order, writes, max_regions):
    """Regions after the first come from the first search's candidates where they are
    left untouched (remapped to the new positions), so they may differ from what k
    fresh scans extract; they must be correct."""
    once = build(blocks, order, writes)
    torch.manual_seed(0)
    args = [torch.randn(3, 4), torch.randn(3, 4)]
    expected = build_function(once, REGISTRY).fn(*[a.clone() for a in args])
    first = build(blocks, order, writes)
    single = DedupRegions(min_nodes=2, max_regions=1).run(first, _ctx())
    result = DedupRegions(min_nodes=2, max_regions=max_regions).run(once, _ctx())
    verify(once, REGISTRY)
    calls = [n for g in (once, *once.subgraphs.values()) for n in g.nodes
             if n.op == CALL_SUBGRAPH]  # (a region may hold calls of an earlier one)
    assert result.stats["regions"] == len(once.subgraphs) <= max_regions
    # (calls a later region took in count once per occurrence of that region)
    assert 0 < len(calls) <= result.stats["occurrences"] or not result.stats["regions"]
    assert result.stats["regions"] >= single.stats["regions"]  # the first is the same
    if single.stats["regions"]:
        (sub,) = first.subgraphs.values()
        assert print_graph(once.subgraphs[sub.name]) == print_graph(sub)
    actual = build_function(once, REGISTRY).fn(*[a.clone() for a in args])
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, equal_nan=True)


def test_one_run_deduplicates_as_much_as_fresh_scans():
    """On 300 random graphs (fixed seed), one run (later regions from the first search's
    candidates) removes at least as many nodes in total as k single-region runs, each a
    fresh scan (measured: more in 12 graphs of 400, fewer in 4)."""
    rng = random.Random(0)
    totals = [0, 0]
    for _ in range(300):
        blocks = [[(rng.choice(UNARY), (rng.randrange(100),)) if rng.random() < 0.5 else
                   (rng.choice(BINARY), (rng.randrange(100), rng.randrange(100)))
                   for _ in range(rng.randint(2, 6))] for _ in range(rng.randint(1, 3))]
        order = [rng.randint(0, 2) for _ in range(rng.randint(2, 12))]
        writes = set(rng.sample(range(12), rng.randint(0, 3)))
        max_regions = rng.randint(2, 4)
        once, stepwise = build(blocks, order, writes), build(blocks, order, writes)
        totals[0] += DedupRegions(min_nodes=2, max_regions=max_regions).run(
            once, _ctx()).stats["nodes_deduplicated"]
        for _ in range(max_regions):
            totals[1] += DedupRegions(min_nodes=2, max_regions=1).run(
                stepwise, _ctx()).stats["nodes_deduplicated"]
    assert totals[1] > 1000 and totals[0] >= totals[1], totals
