"""CausalNeg end to end on a tiny model: the negatives step writes triplets whose negative_sources switch QEM on in
the trainer (and only they do), the training log carries the per-source softmax weights the diagnostics read,
and the gradient probe runs over the run's checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.data import read_jsonl, write_jsonl
from repair.training.causalneg_dynamics import probe_run, read_train_log, weight_dynamics
from repair.differentiation.causalneg.generate import GenerationSettings
from repair.differentiation.causalneg.inputs import CorpusNegatives, load_items
from repair.differentiation.causalneg.pipeline import CONFIGS, run_negatives
from repair.training.trainer import train
from repair.training.config import TrainConfig
from tests.helpers_sources import FakeServer, openai_route
from tests.test_negatives import _scripted_reply

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "demo" / "scifact-tiny"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def causalneg_triplets(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("causalneg")
    items, _ = load_items(TINY, "train")
    corpus = CorpusNegatives(TINY, index_dir=folder / "idx")
    with FakeServer(openai_route(_scripted_reply(), model="served")) as srv:
        from repair.expansion.generation import OpenAIGenerator

        run_negatives(items[:8], folder / "causalneg.jsonl", CONFIGS["causalneg"], generator=OpenAIGenerator(
            srv.url + "/v1"), corpus=corpus, num_mined=2, settings=GenerationSettings(k=2, max_retries=1),
            progress=False)
    return folder / "causalneg.jsonl"


def _train(tiny_model_dir, triplets: Path, out: Path, qem_lambda: float) -> list[dict]:
    cfg = TrainConfig(output_dir=str(out), model=str(tiny_model_dir), triplets=[str(triplets)],
                      num_hard_negatives=-1, max_length=32, global_batch_size=4, mini_batch_size=8, epochs=1,
                      lr=2e-3, temperature=0.05, qem_lambda=qem_lambda, qem_tau=0.1, save_steps=1,
                      save_total_limit=0, device="cpu", seed=3, show_progress=False, lora_r=4, lora_alpha=8)
    train(cfg)
    return read_train_log(out / "train_log.jsonl")


def test_source_labels_switch_qem_on_end_to_end(tmp_path, tiny_model_dir, causalneg_triplets):
    rows = read_jsonl(causalneg_triplets)
    n_gen = sum(r["negative_sources"].count("generated") for r in rows)
    assert n_gen > 0
    log = _train(tiny_model_dir, causalneg_triplets, tmp_path / "qem", qem_lambda=0.5)
    assert [r["step"] for r in log] == [1, 2]
    assert sum(r["n_generated"] for r in log) == n_gen  # every generated negative reached the loss, labelled
    for r in log:
        assert r["qem_queries"] > 0 and r["qem_entropy"] > 0 and r["weight_generated"] is not None
        assert r["loss"] == pytest.approx(r["infonce"] - 0.5 * r["qem_entropy"], rel=1e-5)
    # the same texts without source labels are all "mined": QEM has nothing to act on
    unlabelled = tmp_path / "unlabelled.jsonl"
    write_jsonl(unlabelled, [{k: v for k, v in r.items() if k != "negative_sources"} for r in rows])
    plain = _train(tiny_model_dir, unlabelled, tmp_path / "plain", qem_lambda=0.5)
    assert all(r["qem_queries"] == 0 and r["loss"] == r["infonce"] and r["n_generated"] == 0 for r in plain)
    assert plain[0]["infonce"] == pytest.approx(log[0]["infonce"], rel=1e-5)  # same batch, same weights at step 1
    # what the diagnostics read from the run
    dyn = weight_dynamics(log, windows=2)
    assert [d["weight_generated"] for d in dyn] == pytest.approx([r["weight_generated"] for r in log])
    probes = probe_run(tmp_path / "qem", n=4, device="cpu")
    assert [p["step"] for p in probes] == [0, 1, 2]
    for p in probes:
        assert p["probe_queries"] >= 1 and p["grad_norm_ratio"] > 0
        assert -1.0 <= p["align_pos_generated"] <= 1.0 and 0 < p["weight_generated"] < 1
    assert probes[0]["grad_norm_ratio"] != probes[-1]["grad_norm_ratio"]  # the weights did move
    json.dumps(probes)  # plain floats: goes into diagnostics.json as is
