"""Models beyond the zoo (``model_survey.py``): tiny Hugging Face architectures through
``torch.compile(backend="torchloom")`` against eager: a training step's loss and gradients,
inference at two sizes and, for decoders, greedy decoding through the key/value cache.
CI runs ``CI_MODELS`` (~65 s with compiles on 2 vCPUs); ``TORCHLOOM_SURVEY=full`` runs
every architecture (~15 min), as ``.venv/bin/python benchmarks/model_survey.py`` does.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

pytest.importorskip("transformers")  # in the test extra: always installed

from model_survey import (ABSOLUTE, ARCHS, FLOOR, SLACK, STAGES, Row, build, error,  # noqa: E402
                          in_layout, nudge, survey, train_error)

FULL = os.environ.get("TORCHLOOM_SURVEY", "") == "full"
#: a sliding-window decoder, an encoder with relative positions, an encoder-decoder and a
#: windowed vision model
CI_MODELS = ["mistral", "deberta-v2", "bart", "swin"]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.counted
@pytest.mark.parametrize("name", sorted(ARCHS) if FULL else CI_MODELS)
def test_architecture_matches_eager_with_no_group_on_eager(tmp_path, name):
    row = survey(name, STAGES, dynamic=False, dtype=torch.float32, cache=tmp_path)
    assert not row.raised, row.raised
    decoder = ARCHS[name].decodes  # decoders with a key/value cache decode
    assert set(row.errors) == set(STAGES) - (set() if decoder else {"decode"})
    assert row.ok(), row.errors
    assert row.groups.groups > 0 and row.groups.on_eager == 0, row.groups
    assert row.groups.fallbacks == ()


@pytest.mark.counted
def test_the_error_measure():
    want = torch.tensor([1.0, -4.0, float("inf")])
    assert error(want.clone(), want) == 0.0
    assert error(torch.tensor([1.0, -3.0, float("inf")]), want) == pytest.approx(0.25)
    assert error(torch.tensor([1.0, -4.0, float("nan")]), want) == math.inf  # nan for inf
    assert error(torch.tensor([1.0, -4.0, -float("inf")]), want) == math.inf  # its sign
    assert error(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")])) == 0.0
    assert error(torch.tensor([1.0, -4.0]), want[:2].reshape(2, 1)) == math.inf
    assert error(None, None) == 0.0 and error(None, want) == math.inf
    tiny = torch.tensor([1e-12, -2e-12])  # rounding noise of a zero gradient
    assert error(tiny, -tiny) == pytest.approx(2.0)  # against itself alone: far off
    assert error(tiny, -tiny, floor=FLOOR * 0.5) < 1e-8  # against the model's gradients


@pytest.mark.counted
def test_the_training_measure_weighs_ours_against_eagers_own_error():
    exact = torch.tensor([1.0, -2.0], dtype=torch.float64)
    off = 2.0 ** -20  # eager is off by ~1e-6, exactly so in float32 (half that of the scale)
    eager = torch.tensor([1.0 + off, -2.0])
    same = train_error(eager.clone(), eager, exact)
    assert same == pytest.approx(off / 2 / (SLACK * off / 2 + ABSOLUTE))
    assert same < 1.0
    # three times eager's error and the absolute slack is the bound
    bound = (SLACK * off / 2 + ABSOLUTE) * 2.0
    assert train_error(torch.tensor([1.0 + 0.9 * bound, -2.0]), eager, exact) < 1.0
    assert train_error(torch.tensor([1.0 + 1.1 * bound, -2.0]), eager, exact) > 1.0
    # an ill-conditioned gradient: eager far off too, so ours may be as far
    assert train_error(torch.tensor([1.1, -2.0]), torch.tensor([0.95, -2.0]), exact) < 1.0
    assert train_error(None, eager, exact) == math.inf
    assert train_error(torch.tensor([float("nan"), -2.0]), eager, exact) == math.inf
    assert train_error(None, None, None) == 0.0


@pytest.mark.counted
def test_eagers_error_is_the_larger_of_its_step_and_a_nudged_ones():
    exact = torch.tensor([1.0, -2.0], dtype=torch.float64)
    lucky = torch.tensor([1.0, -2.0])  # eager exact by luck: only the absolute slack
    ours = torch.tensor([1.0 + 2.0 ** -12, -2.0])
    assert train_error(ours, lucky, exact) > 1.0
    unlucky = torch.tensor([1.0 - 2.0 ** -11, -2.0])  # eager a rounding away: further off
    assert train_error(ours, lucky, exact, nudged=unlucky) == pytest.approx(
        train_error(ours, unlucky, exact))
    assert train_error(ours, lucky, exact, nudged=unlucky) < 1.0
    assert train_error(ours, unlucky, exact, nudged=lucky) < 1.0  # the larger, either way
    assert train_error(ours * 64, lucky, exact, nudged=unlucky) > 1.0  # still a bound


@pytest.mark.counted
def test_nudge_moves_every_weight_one_float_up_or_down():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32))
    model[0].weight.data[0, :4] = torch.tensor([0.0, 1.0, -1.0, 3e-38])
    nudged = nudge(model)
    for (name, p), q in zip(model.named_parameters(), nudged.parameters()):
        up, down = torch.nextafter(p, torch.tensor(math.inf)), torch.nextafter(
            p, torch.tensor(-math.inf))
        moved_up, moved_down = q == up, q == down
        assert (moved_up ^ moved_down).all(), name
        assert moved_up.any() and moved_down.any(), name
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), nudged.buffers()))
    assert torch.equal(nudge(model).state_dict()["0.weight"], nudged.state_dict()["0.weight"])


@pytest.mark.counted
@pytest.mark.parametrize("name", ["bert", "deberta-v2"])
def test_training_with_dropout_draws_eagers_masks(tmp_path, name):
    """DeBERTa-v2: disentangled attention, its relative embeddings' dropout live (dead, it
    was drawn by eager only: the front end drops it, aot_eager's state differs too)."""
    model = build(ARCHS[name], dropout=0.1)
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
    row = survey(name, ("train",), dynamic=False, dtype=torch.float32, cache=tmp_path,
                 dropout=0.1)
    assert not row.raised, row.raised  # (the generator's state after the step: eager's)
    assert row.ok() and set(row.errors) == {"train"}, row.errors
    assert row.groups.on_eager == 0 and row.groups.fallbacks == ()


@pytest.mark.counted
def test_bfloat16_inference_feeds_images_in_the_models_dtype(tmp_path):
    row = survey("resnet", ("infer",), dynamic=False, dtype=torch.bfloat16, cache=tmp_path)
    assert not row.raised, row.raised  # (float32 pixels into a bf16 model raised)
    assert row.ok() and set(row.errors) == {"infer"}, row.errors


@pytest.mark.counted
def test_channels_last_images_and_weights(tmp_path):
    batch = in_layout({"pixel_values": torch.zeros(2, 3, 8, 8), "labels": torch.zeros(2)},
                      True)
    assert batch["pixel_values"].is_contiguous(memory_format=torch.channels_last)
    assert not batch["pixel_values"].is_contiguous()
    row = survey("resnet", ("infer", "train"), dynamic=False, dtype=torch.float32,
                 cache=tmp_path, channels_last=True)
    assert not row.raised, row.raised
    assert row.ok() and set(row.errors) == {"infer", "train"}, row.errors
    assert row.groups.on_eager == 0 and row.groups.fallbacks == ()


@pytest.mark.counted
def test_a_row_that_measured_nothing_is_not_ok():
    assert not Row("x").ok()
    assert Row("x", {"infer": 0.5}).ok() and not Row("x", {"infer": 1.5}).ok()
    assert not Row("x", {"infer": 0.5}, raised="RuntimeError: x").ok()


@pytest.mark.counted
def test_symbolic_sizes_in_shared_subgraphs_leave_no_group_on_eager(tmp_path):
    """BEiT at ``dynamic=True``: its relative position bias, sized ``2*(s//8)-1`` from the
    image side ``s``, is repeated per layer, so ``dedup.regions`` shares it; a group there
    needs ``s`` and ran on eager until the size carrier came through the subgraph."""
    row = survey("beit", ("infer", "train"), dynamic=True, dtype=torch.float32,
                 cache=tmp_path)
    assert not row.raised, row.raised
    assert set(row.errors) == {"infer", "train"} and row.ok(), row.errors
    assert row.groups.groups > 0 and row.groups.on_eager == 0, row.groups


@pytest.mark.counted
def test_a_state_space_model_decodes_through_its_state(tmp_path):
    """Mamba's cache is a state (``cache_params``: its convolution window and recurrent
    state, updated in place each step), fed back as a key/value cache is."""
    assert ARCHS["mamba"].decodes and ARCHS["mamba"].cache == "cache_params"
    row = survey("mamba", ("decode",), dynamic=False, dtype=torch.float32, cache=tmp_path)
    assert not row.raised, row.raised
    assert set(row.errors) == {"decode"} and row.ok(), row.errors
    assert row.groups.on_eager == 0 and row.groups.fallbacks == ()


@pytest.mark.counted
def test_activation_checkpointing_with_dropout_compiles_every_graph(tmp_path):
    """Checkpointing recomputes each layer in the backward, replaying the random state
    (``run_with_rng_state`` of dropout and SDPA): whole graphs ran on eager before."""
    model = build(ARCHS["llama"], dropout=0.1, checkpoint=True)
    assert model.is_gradient_checkpointing
    row = survey("llama", ("train",), dynamic=False, dtype=torch.float32, cache=tmp_path,
                 dropout=0.1, checkpoint=True)
    assert not row.raised, row.raised  # (the generator's state after the step: eager's)
    assert set(row.errors) == {"train"} and row.ok(), row.errors
    assert row.groups.fallbacks == () and row.groups.groups > 0, row.groups
    assert row.groups.on_eager == 0
