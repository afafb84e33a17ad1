"""bench/gpu_check.sh: the CPU dry run and its argument checks (as a user runs them), and the pieces of the GPU
check that run without a GPU -- the MFU arithmetic, the GPU-name table, the Qwen2.5-0.5B shape, the top-k
agreement rule, the sections on a tiny model on the CPU, and a failing / hanging section being reported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gc = _load()
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


# ---------------------------------------------------------------------------------------------- the script
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the script runs the real check")
def test_cpu_only_machine_prints_cuda_false_after_argument_checks_and_exits_0(tmp_path):
    out = tmp_path / "gpu.json"
    proc = _run("--skip", "search", "--out", str(out), "--timeout_s", "300")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["cuda"] is False and summary["dry_run"] is True
    assert summary["message"] == gc.CPU_ONLY_MESSAGE
    plan = summary["plan"]
    assert plan["skipped"] == ["search"] and list(plan["sections"]) == ["encode", "train", "demo"]
    # the budget is split by weight (1.5 : 2 : 5 of 300 s)
    assert [plan["sections"][s]["timeout_s_at_least"] for s in ("encode", "train", "demo")] == [52.9, 70.6, 176.5]
    assert json.loads(out.read_text()) == summary


@pytest.mark.parametrize("args, message", [
    (["--skip", "demo,nosuch"], "gpu_check: error: --skip: unknown section(s) nosuch (sections: "
                                "encode,train,search,demo)"),
    (["--timeout_s", "abc"], "gpu_check: error: argument --timeout_s: invalid float value: 'abc'"),
    (["--train_mini_batch", "64"], "gpu_check: error: --train_mini_batch (64) must be smaller than "
                                   "--train_global_batch (64) so that GradCache chunks the batch"),
    (["--out", "/nonexistent-folder/x.json"], "gpu_check: error: --out /nonexistent-folder/x.json: folder "
                                              "/nonexistent-folder does not exist"),
])
def test_bad_argument_exits_2_with_one_line_error(args, message):
    proc = _run(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [message]


# ---------------------------------------------------------------------------------------------- pure pieces
def test_mfu_arithmetic_for_qwen25_05b_shape():
    # 357,826,560 linear weights, 24 layers, 14 heads x 64 = 896, 512 tokens per row
    flops = gc.forward_flops_per_token(357_826_560, 24, 512, 896)
    assert flops == 2 * 357_826_560 + 4 * 24 * 512 * 896 == 759_693_312
    assert gc.mfu(100_000, flops, 989.0) == pytest.approx(759_693_312e5 / 989e12)  # 0.0768
    assert round(gc.mfu(100_000, flops, 989.0), 4) == 0.0768
    assert gc.mfu(100_000, flops, None) is None


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H200", 989.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.0), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0), ("NVIDIA A10", 125.0),
    ("NVIDIA A10G", None), ("Tesla V100-SXM2-16GB", None), ("NVIDIA GH200 480GB", 989.0),
])
def test_peak_bf16_table_matches_cuda_device_names(name, tflops):
    assert gc.peak_bf16_tflops(name) == tflops


def test_config_has_qwen25_05b_shapes_and_parameter_count():
    """494,032,768 parameters is Qwen2.5-0.5B's count; built on the meta device (no memory, no download)."""
    from transformers import AutoModel

    config = gc.qwen25_05b_config()
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", None)}
    assert rope["rope_theta"] == 1_000_000.0 and config.tie_word_embeddings
    with torch.device("meta"):
        model = AutoModel.from_config(config, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 494_032_768
    assert gc.matmul_params(model) == 357_826_560


def test_topk_agreement_separates_tie_swaps_from_real_differences():
    ids_ref = np.array([[5, 7, 9], [1, 2, 3], [4, 6, 8]])
    scores_ref = np.array([[0.9, 0.8, 0.7], [0.5, 0.4, 0.3], [0.6, 0.5, 0.4]], dtype=np.float32)
    ids = ids_ref.copy()
    scores = scores_ref.copy()
    ids[1] = [2, 1, 3]                     # neighbours swapped: their scores differ by rounding only
    scores[1, 0] += 2e-7
    ids[2] = [4, 6, 11]                    # a different document at rank 3 with a clearly lower score
    scores[2, 2] = 0.35
    got = gc.topk_agreement(ids, scores, ids_ref, scores_ref, tol=1e-5)
    assert got == {"rows": 3, "identical": 1, "tie_swaps": 1, "different": 1, "agree": False,
                   "max_abs_score_diff": pytest.approx(0.05, abs=1e-6)}
    ids[2], scores[2] = ids_ref[2], scores_ref[2]
    assert gc.topk_agreement(ids, scores, ids_ref, scores_ref)["agree"] is True
    with pytest.raises(ValueError, match="shapes differ"):
        gc.topk_agreement(ids[:, :2], scores[:, :2], ids_ref, scores_ref)


def test_score_error_catches_ids_that_do_not_match_their_scores():
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((50, 8)).astype(np.float32)
    queries = rng.standard_normal((3, 8)).astype(np.float32)
    ids = np.argsort(-(queries @ docs.T), axis=1)[:, :5]
    scores = np.take_along_axis(queries @ docs.T, ids, axis=1)
    assert gc.score_error(queries, docs, ids, scores, [0, 1, 2]) < 1e-5
    shifted = ids + 1  # an off-by-one index bug
    assert gc.score_error(queries, docs, shifted, scores, [0, 1, 2]) > 0.1


# ---------------------------------------------------------------------------------------------- sections on CPU
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=49152)


def test_encode_and_train_sections_run_on_a_tiny_model_on_cpu(tmp_path):
    """The code the GPU runs, on CPU: tokens/s from the timed loop, MFU 'unknown' off the table, and a real
    LoRA + GradCache + checkpointing step whose tokens and chunk count match the batch."""
    config = gc.qwen25_05b_config(**TINY)
    enc = gc.section_encode("cpu", config, seq_len=32, batch=4, seconds=0.2)
    assert enc["tokens_per_s"] == pytest.approx(enc["iters"] * 4 * 32 / enc["seconds"], rel=0.01)
    assert enc["mfu"] == "unknown" and enc["embedding_norm"] == pytest.approx(1.0, abs=1e-3)
    assert enc["forward_flops_per_token"] == 2 * enc["matmul_params"] + 4 * 2 * 32 * 64
    train = gc.section_train("cpu", config, tmp_path, seq_len=32, global_batch=8, mini_batch=4, steps=2)
    assert train["status_of_train"] == "finished" and train["steps"] == 2
    assert train["gradient_checkpointing"] == "on" and "q_proj" in train["lora_targets"]
    assert train["documents_per_step"] == 16  # positive + hard negative per query
    assert train["gradcache_chunks_per_step"] == 2 + 4
    # passages are truncated to exactly seq_len tokens; queries add their instruction-formatted tokens
    assert all(t > 16 * 32 for t in train["tokens_per_step"])
    assert train["tokens_per_s"] == pytest.approx(train["tokens_per_step"][1] / train["seconds_per_step"][1],
                                                  rel=0.02)
    assert all(np.isfinite(train["loss"]))


def test_search_section_agrees_with_itself_on_cpu():
    got = gc.section_search("cpu", n_docs=3000, n_queries=40, dim=16, k=10)
    assert got["agree"] is True
    assert got["backends"]["torch_gpu"]["vs_torch_cpu"]["identical"] == 40
    assert got["backends"]["torch_cpu"]["max_score_error_vs_float64"] < 1e-5


# ---------------------------------------------------------------------------------------------- failures reported
def test_failed_and_timed_out_sections_are_reported_with_their_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA so that the cuda section fails")
    args = gc.parse_args(["--search_docs", "100", "--search_queries", "4", "--search_dim", "8", "--k", "5"])
    failed = gc.run_section_child("search", args, tmp_path, timeout_s=120)
    assert failed["status"] == "error"
    assert "CUDA" in failed["error"] and "Traceback" in failed["traceback"]
    hung = gc.run_section_child("search", args, tmp_path, timeout_s=0.3)  # still importing torch
    assert hung["status"] == "timeout" and hung["error"] == "section killed after 0.3 s (its timeout)"
