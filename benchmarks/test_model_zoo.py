"""The model zoo of issue 41 (``model_zoo.py``: Hugging Face models built from configs,
random weights, nothing downloaded) through ``torch.compile(backend="torchloom")`` against
eager, same run, interleaved rounds, one thread (``TORCHLOOM_BENCH_THREADS`` to choose).

CI runs ``CI_ROWS`` (a training step and inference of two models and GPT-2's compiled
optimizer step, ~25 s with compiles) and
the structural test over every model's training step (forward and backward graphs, ~50 s).
``TORCHLOOM_ZOO=full`` runs every row of the zoo and the structural test over training and
inference, and measures Inductor in the same rounds (printed and
recorded in ``extra_info``, not gated: its cold compiles take minutes); the table with
Inductor, 1 and 2 threads and first-call seconds comes from the script::

    TORCHLOOM_ZOO=full .venv/bin/python -m pytest benchmarks/test_model_zoo.py -s
    .venv/bin/python benchmarks/model_zoo.py --threads 2 1 --out table.md

Gates: torchloom's speed over eager (eager ms / torchloom ms) per row, ``GATES``, with
retries (a burst of load on the shared 2-core machine can slow one side of a
measurement); measured figures are in ``benchmarks/RESULTS.md`` ("Model zoo").
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")  # in the test extra: always installed

from model_zoo import MODES, ZOO, eager_groups, make_side, rows  # noqa: E402

FULL = os.environ.get("TORCHLOOM_ZOO", "") == "full"
#: the rows the structural test compiles per model (inference's groups are mostly the
#: training forward's)
STRUCTURE_MODES = ("train", "infer") if FULL else ("train",)
CI_ROWS = [("gpt2", "train"), ("vit", "infer"), ("gpt2", "optimizer")]
ROWS = rows(ZOO, MODES) if FULL else CI_ROWS
#: minimum speed-up over eager per row (default ``DEFAULT_GATE``): what it keeps with margin
GATES: dict[tuple[str, str], float] = {
    # the compiled AdamW step against eager's foreach step: 2.75x measured (1 thread)
    ("gpt2", "optimizer"): 2.0,
}
DEFAULT_GATE = 0.9
RETRIES = 2
#: groups on the eager codegen allowed per model (training step and inference together),
#: by the reasons the native codegens gave: what they are now. Issue 41's goal is none:
#: lower a count when a codegen learns the group, never raise one.
ALLOWED_ON_EAGER: dict[str, dict[str, int]] = {name: {} for name in ZOO}
#: (model, mode) -> what torchloom compiled for it, filled by the row tests
SEEN: dict[tuple[str, str], object] = {}


@pytest.fixture(autouse=True)
def threads():
    """Every side on one thread (``TORCHLOOM_BENCH_THREADS`` to choose another count): with
    two, a time slice lost to another process stalls every parallel region."""
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("TORCHLOOM_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(before)
    torch._dynamo.reset()


@pytest.mark.parametrize("name,mode", ROWS)
def test_zoo_row_against_eager(perf_gate, tmp_path, name, mode):
    sides = ("eager", "torchloom", "inductor") if FULL else ("eager", "torchloom")
    built = {side: make_side(name, mode, side, tmp_path) for side in sides}
    torchloom, eager = built["torchloom"], built["eager"]
    SEEN[(name, mode)] = eager_groups(torchloom.compiler)
    line = f"\n{name} {mode}:"
    if FULL:
        versus = perf_gate.measure(torchloom.step, built["inductor"].step, rounds=5,
                                   warmup=1)
        perf_gate.benchmark.extra_info.update(
            inductor_median_s=versus.baseline_s, speedup_over_inductor=versus.speedup,
            first_call_s={k: v.first_call_s for k, v in built.items()})
        line += (f" {versus.speedup:.2f}x Inductor ({versus.candidate_s * 1e3:.1f} vs "
                 f"{versus.baseline_s * 1e3:.1f} ms; first call {torchloom.first_call_s:.1f}"
                 f" vs {built['inductor'].first_call_s:.1f} s),")
    result = perf_gate(torchloom.step, eager.step, min_speedup=GATES.get((name, mode),
                                                                         DEFAULT_GATE),
                       rounds=5, warmup=1, names=("torchloom", "eager"), retries=RETRIES)
    print(f"{line} {result.speedup:.2f}x eager ({result.candidate_s * 1e3:.1f} vs "
          f"{result.baseline_s * 1e3:.1f} ms, {torch.get_num_threads()} thread(s))")


def _compiled(name: str, mode: str, tmp_path: Path):
    """What torchloom compiled for a row (from the row's test when it ran)."""
    if (name, mode) not in SEEN:
        SEEN[(name, mode)] = eager_groups(make_side(name, mode, "torchloom",
                                                    tmp_path).compiler)
        torch._dynamo.reset()
    return SEEN[(name, mode)]


@pytest.mark.counted
@pytest.mark.parametrize("name", list(ZOO))
def test_groups_on_eager_do_not_grow(tmp_path, name):
    """Every fusion group of the model's training step (and inference) that runs on the
    ``eager`` codegen, with the reasons the native codegens gave, is one that
    ``ALLOWED_ON_EAGER`` lists (a count per reason, what it is now); no graph falls back
    whole to eager.
    """
    reasons: collections.Counter[str] = collections.Counter()
    for mode in STRUCTURE_MODES:
        seen = _compiled(name, mode, tmp_path / mode)
        assert seen.fallbacks == (), seen.fallbacks
        reasons.update(seen.reasons)
    print(f"\n{name}: {sum(reasons.values())} group(s) on eager"
          + "".join(f"\n  {n}x {r}" for r, n in reasons.most_common()))
    allowed = ALLOWED_ON_EAGER[name]
    grown = {r: (n, allowed.get(r, 0)) for r, n in reasons.items() if n > allowed.get(r, 0)}
    assert not grown, f"{name}: groups on eager beyond the allow-list (seen, allowed): {grown}"


@pytest.mark.counted
def test_the_table_pairs_each_round_and_names_slow_first_calls():
    """The speed-ups are medians of ratios taken within a round (a round where the machine
    ran at half speed moves both sides alike), and the first-call line names the rows
    above 0.3x Inductor's."""
    from model_zoo import RowResult, first_calls, interleaved, paired_ratios, table_row
    calls = []
    samples = interleaved({"eager": lambda: calls.append("e"),
                           "torchloom": lambda: calls.append("t")}, rounds=3, warmup=1)
    assert calls == ["e", "t", "e", "t", "t", "e", "e", "t"]  # the order rotated
    assert [len(v) for v in samples.values()] == [3, 3]
    slow_round = {"eager": [2.0, 4.0, 2.2], "torchloom": [1.0, 2.0, 1.1],
                  "inductor": [0.9, 1.8, 0.99]}  # the second round at half speed
    paired = paired_ratios(slow_round)
    assert paired == pytest.approx({"eager": 2.0, "torchloom": 1.0, "inductor": 0.9})
    assert paired_ratios({"eager": [1.0]}) == {}
    row = RowResult("gpt2", "infer", 2, {"eager": 2.2, "torchloom": 1.1, "inductor": 1.0},
                    {"torchloom": 4.0, "inductor": 10.0}, None, paired)
    assert row.speedup("inductor") == pytest.approx(0.9)  # (1.0 / 1.1 from the medians)
    assert "| 2.00 | 0.90 | 10.0 | 4.0 |" in table_row(row)
    assert first_calls([row]) == ["- first calls: torchloom 0.40-0.40x Inductor's; above "
                                  "0.3x: GPT-2 infer 0.40"]


@pytest.mark.counted
def test_untimed_steps_run_until_the_products_trials_decide():
    """torchloom's side steps until no matrix product's trial is under way (the rounds
    time what later steps run), never more than ``TRIAL_STEPS``; no compiler, no step."""
    from model_zoo import TRIAL_STEPS, settle_trials

    class Compiler:
        def __init__(self, left):
            self.left, self.gemms = left, self
            self.trials = {"mm": "under way"} if left else {}

        def step(self):
            self.left -= 1
            if self.left == 0:
                self.trials = {}

    for left, ran in ((0, 0), (1, 1), (3, 3), (TRIAL_STEPS + 5, TRIAL_STEPS)):
        compiler = Compiler(left)
        assert settle_trials(compiler.step, compiler) == ran
    assert settle_trials(lambda: pytest.fail("stepped"), None) == 0


@pytest.mark.counted
def test_steps_timed_inside_their_side_give_their_own_seconds():
    """A side in another process times its own step (``timed_inside``): the seconds it
    returns are the sample, not the time around the message."""
    from model_zoo import interleaved
    given = {"eager": iter([0.5, 0.25, 0.125]), "torchloom": iter([1.0, 2.0, 3.0])}
    samples = interleaved({k: lambda it=v: next(it) for k, v in given.items()}, rounds=2,
                          warmup=1, timed_inside=True)
    assert samples == {"eager": [0.25, 0.125], "torchloom": [2.0, 3.0]}
    start = time.perf_counter()  # a pause before each step, outside its time
    samples = interleaved({"eager": lambda: None, "torchloom": lambda: None}, rounds=2,
                          warmup=1, gap_s=0.02)
    assert time.perf_counter() - start >= 6 * 0.02 and max(samples["eager"]) < 0.02


@pytest.mark.counted
def test_isolated_sides_each_run_in_a_process_of_their_own(tmp_path):
    """``--isolate``: every side is built, compiled and stepped by a worker process; the
    row carries the same results as in one process (times, first calls, torchloom's
    groups), and a side that fails names itself with its error."""
    from zoo_isolated import SideFailed, measure_row_isolated
    row = measure_row_isolated("vit", "infer", 1, sides=("eager", "torchloom"), rounds=2,
                               warmup=0, cache_root=tmp_path)
    assert set(row.ms) == set(row.first_call_s) == {"eager", "torchloom"}
    assert all(v > 0 for v in row.ms.values()) and all(v > 0 for v in row.first_call_s.values())
    assert row.groups is not None and row.groups.groups > 0 and row.groups.on_eager == 0
    assert row.paired["torchloom"] == 1.0 and row.paired["eager"] > 0
    assert any(tmp_path.iterdir())  # torchloom's worker compiled into the given cache
    with pytest.raises(SideFailed, match=r"nonsense: ValueError: side 'nonsense'"):
        measure_row_isolated("vit", "infer", 1, sides=("nonsense",), rounds=1)
