"""Scripts 01-04 end to end as subprocesses on a tiny random model and a 40-pair T0, plus their refusals.

Values are checked against independent computations from the files the scripts wrote (brute-force margins
from the embedding cache, CCS counted by plain loops, FINCH from finch-clust, the merge as a set union).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from repair.diagnosis import margins as dg
from repair.diagnosis import stages as st
from repair.cli import run_script as run_cli_script
from repair.diagnosis.concepts import extract_concepts
from repair.data import load_seed, read_json, read_jsonl

from helpers_diagnosis import build_controlled_ner

ROOT = Path(__file__).resolve().parents[1]
T0 = ROOT / "tests" / "fixtures" / "t0_materials_40.jsonl"
SCRIPTS = ROOT / "diagnosis"
TOP_K, TOP_NEG_N = 10, 5


def run_script(name: str, *args: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name.replace(".py", "").lstrip("0123456789_"), SCRIPTS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_inprocess(name: str, *args: str) -> dict:
    return load_script(name).main(list(args))


def refused(name: str, *args: str, capsys) -> str:
    """Run a script's CLI entry (repair.cli.run_script) in-process; it must exit with status 2 and one error line."""
    module = load_script(name)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_cli_script(module.main, [*args, "--log_level", "WARNING"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, tiny_model_dir):
    base = tmp_path_factory.mktemp("diagnosis_e2e")
    env = {**os.environ, "REPAIR_CACHE": str(base / "repair_cache"), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("DIA_OUT_DIR", None)
    env.pop("TRAIN_PT", None)
    run = base / "run"
    ner = build_controlled_ner(base / "ner", {"oxygen": "B-matname", "va": "I-matname", "##can": "I-matname",
                                              "##cies": "I-matname"})
    common = ["--train_pt", str(T0), "--out_dir", str(run), "--model", str(tiny_model_dir), "--top_k", str(TOP_K),
              "--max_length", "64", "--batch_size", "16", "--device", "cpu"]
    out = {"run": run, "base": base, "env": env, "model": tiny_model_dir}
    out["s1"] = run_script("01_diagnosis_margin.py", *common, "--pct", "30", "40", env=env)
    out["s2"] = run_script("02_pathA_ccs_regex.py", "--pct", "30", "--dia_out_dir", str(run), "--top_neg_n",
                           str(TOP_NEG_N), env=env)
    out["s2_ner"] = run_script("02_pathA_ccs_matdetector.py", "--pct", "30", "--dia_out_dir", str(run),
                               "--top_neg_n", str(TOP_NEG_N), "--model", str(ner), "--device", "cpu", env=env)
    out["s3"] = run_script("03_pathB_finch.py", "--pct", "30", "--dia_out_dir", str(run), "--device", "cpu",
                           "--levels", "0", env=env)
    out["s4"] = run_script("04_merge_cconf.py", "--pct", "30", "--dia_out_dir", str(run), env=env)
    return out


def test_01_outputs_and_margins(pipeline):
    run = pipeline["run"]
    meta = read_json(run / dg.META_FILE)
    seed = load_seed(T0)
    assert pipeline["s1"]["forward_texts"] == 78  # 39 distinct queries + 39 distinct passages, no cache yet
    assert meta["num_queries"] == 40 and meta["search"]["top_k"] == TOP_K
    assert meta["model"]["fingerprint"] == meta["fingerprint"] == pipeline["s1"]["fingerprint"]
    assert set(meta["percentiles"]) == {"30", "40"} and meta["duplicates"]["rows_with_twins"] == 4
    assert set(meta["margin_stats"]) >= {"min", "max", "mean", "p01", "p50", "p99"}
    reps, info = dg.load_reps(run / meta["pathB"]["train_query_cache"])
    docs, _ = dg.load_reps(run / meta["caches"]["doc"])
    assert reps.dtype == torch.float16 and tuple(reps.shape) == (40, 64) and info["embed_key"] == meta["embed_key"]
    assert torch.allclose(reps.float().norm(dim=1), torch.ones(40), atol=2e-3)

    # brute force from the caches: margin = s(q_i, d_i) - max over non-positives (twins: 36/37 query, 38/39 passage)
    s = reps.float().numpy() @ docs.float().numpy().T
    positives = {i: {i} for i in range(40)}
    for a, b in ((36, 37), (38, 39)):
        positives[a] |= {b}
        positives[b] |= {a}
    all_lines = read_jsonl(run / dg.MARGINS_FILE)
    assert [r["i"] for r in all_lines] == list(range(40))
    for r in all_lines:
        i = r["i"]
        neg = max(s[i, j] for j in range(40) if j not in positives[i])
        assert r["margin_cos"] == pytest.approx(s[i, i] - neg, abs=1e-5)
        assert r["topk_doc_indices_cos"] == [int(j) for j in np.argsort(-s[i], kind="stable")[:TOP_K]]
        assert r["positive_doc_indices"] == sorted(positives[i])
        assert r["query"] == seed.queries[i]
    margins = np.array([r["margin_cos"] for r in all_lines])
    for pct in (30, 40):
        entry = meta["percentiles"][str(pct)]
        assert entry["threshold"] == pytest.approx(np.quantile(margins, pct / 100), abs=1e-6)
        lines = read_jsonl(run / dg.confused_name(pct))
        assert [r["i"] for r in lines] == [i for i in range(40) if margins[i] <= entry["threshold"]]
        assert entry["confused"] == len(lines) and set(lines[0]) == set(dg.MARGIN_FIELDS) | {"positive_doc_indices"}


def test_01_rerun_reuses_everything(pipeline, monkeypatch):
    monkeypatch.setenv("REPAIR_CACHE", pipeline["env"]["REPAIR_CACHE"])
    before = {f: f.stat().st_mtime_ns for f in pipeline["run"].glob("*.jsonl")}
    again = run_inprocess("01_diagnosis_margin.py", "--train_pt", str(T0), "--out_dir", str(pipeline["run"]),
                          "--model", str(pipeline["model"]), "--top_k", str(TOP_K), "--max_length", "64",
                          "--device", "cpu", "--pct", "30")
    assert {f: f.stat().st_mtime_ns for f in pipeline["run"].glob("*.jsonl")} == before  # nothing rewritten
    assert again["forward_texts"] == 0 and again["reused_embeddings"] and again["reused_search"]
    assert again["run_key"] == pipeline["s1"]["run_key"]
    assert again["confused"] == {"30": pipeline["s1"]["confused"]["30"]}
    meta = read_json(pipeline["run"] / dg.META_FILE)
    assert set(meta["percentiles"]) == {"30", "40"}  # the 40% file of the same run stays valid


def _confused_and_seed(run):
    return read_jsonl(run / dg.confused_name(30)), load_seed(T0)


def _negatives(rec):
    pos = set(rec["positive_doc_indices"])
    return [d for d in rec["topk_doc_indices_cos"] if d not in pos][:TOP_NEG_N]


def test_02_regex_ccs_matches_plain_count(pipeline):
    run = pipeline["run"]
    out = run / "pathA_ccs_train"
    rank = read_json(out / st.patha_rank_name(30))
    meta = read_json(run / dg.META_FILE)
    assert rank["pct"] == 30 and rank["diagnosis_run_key"] == meta["run_key"] and rank["eps_pos"] == 0.5
    assert rank["extractor"]["extractor"] == "regex" and rank["df"] == "incidence"
    confused, seed = _confused_and_seed(run)
    neg, pos = Counter(), Counter()
    for rec in confused:
        pos.update(set(extract_concepts(seed.passages[rec["pos_doc_index"]])))
        for d in _negatives(rec):
            neg.update(set(extract_concepts(seed.passages[d])))
    want = {e: (neg[e] / (pos[e] + 0.5), neg[e], pos[e]) for e in neg}
    got = {e["entity"]: (e["CCS"], e["freq_neg"], e["freq_pos"]) for e in rank["entities"]}
    assert set(got) == set(want) and len(got) > 5
    for e, (ccs, n_neg, n_pos) in want.items():
        assert got[e] == (pytest.approx(ccs), n_neg, n_pos), e
    per_query = read_json(out / st.per_query_name(30))
    cintra = read_jsonl(out / st.cintra_name(30))
    assert len(cintra) == pipeline["s2"]["cintra_lines"] == len(confused)
    for line in cintra:
        concepts = per_query[str(line["query_i"])]
        assert line["concept"] in concepts and line["CCS"] == max(got[c][0] for c in concepts)
    assert len(read_jsonl(out / st.patha_top_name(30))) == min(200, len(got))


def test_02_matdetector_entities(pipeline):
    run = pipeline["run"]
    out = run / "pathA_ccs_matdetector"
    rank = read_json(out / st.patha_rank_name(30))
    assert rank["extractor"]["extractor"] == "token-classification"
    assert rank["extractor"]["labels"] == {"0": "O", "1": "B-matname", "2": "I-matname", "3": "B-mf", "4": "I-mf"}
    confused, seed = _confused_and_seed(run)
    neg = sum("Oxygen vacancies" in seed.passages[d] for rec in confused for d in _negatives(rec))
    pos = sum("Oxygen vacancies" in seed.passages[rec["pos_doc_index"]] for rec in confused)
    assert neg > 0
    assert [(e["entity"], e["freq_neg"], e["freq_pos"]) for e in rank["entities"]] == [("Oxygen vacancies", neg, pos)]


def test_03_finch_clusters_equal_finch_clust(pipeline):
    run = pipeline["run"]
    out = run / "pathB_finch_train"
    meta = read_json(run / dg.META_FILE)
    confused, _ = _confused_and_seed(run)
    rows = [r["i"] for r in confused]
    reps, _ = dg.load_reps(run / meta["pathB"]["train_query_cache"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from finch import FINCH
    c, _, _ = FINCH(reps[rows].float().numpy(), distance="cosine", verbose=False)
    assignments = read_jsonl(out / st.assignments_name(30))
    assert [a["i"] for a in assignments] == rows
    ours = [a["component_id"] for a in assignments]
    theirs = c[:, 0].tolist()
    n = len(ours)
    assert all((ours[x] == ours[y]) == (theirs[x] == theirs[y]) for x in range(n) for y in range(n))
    comps = read_json(out / st.components_name(30))
    assert comps["diagnosis_run_key"] == meta["run_key"] and comps["num_clusters"] == len(set(c[:, 0]))
    per_query = read_json(run / "pathA_ccs_train" / st.per_query_name(30))
    for comp in comps["components_sorted_by_avg_margin_asc"]:
        members = [a for a in assignments if a["component_id"] == comp["component_id"]]
        counts = Counter(x for a in members for x in per_query[str(a["i"])])
        top = max(counts.values()) if counts else 0
        assert comp["size"] == len(members) and comp["concept_count"] == top
        assert comp["concept"] in [k for k, v in counts.items() if v == top] or (not counts and comp["concept"] == "")
        assert comp["avg_margin"] == pytest.approx(np.mean([a["margin_cos"] for a in members]))
    avg = [comp["avg_margin"] for comp in comps["components_sorted_by_avg_margin_asc"]]
    assert avg == sorted(avg)


def test_04_merge_is_the_case_insensitive_union(pipeline):
    run = pipeline["run"]
    cintra = [r["concept"] for r in read_jsonl(run / "pathA_ccs_train" / st.cintra_name(30))]
    comps = read_json(run / "pathB_finch_train" / st.components_name(30))["components_sorted_by_avg_margin_asc"]
    inter = [c["concept"] for c in comps if c["concept"]]
    txt = (run / "PathAB_terms" / st.final_terms_name(30, "txt")).read_text().splitlines()
    assert [t.lower() for t in txt] == sorted({t.lower() for t in cintra + inter})
    final = read_json(run / "PathAB_terms" / st.final_terms_name(30, "json"))
    assert final["counts"]["union_total"] == len(txt) == pipeline["s4"]["union_total"]
    for term in final["terms"]:
        assert ("A" in term["from"]) == (term["term"].lower() in {t.lower() for t in cintra})
        assert ("B" in term["from"]) == (term["term"].lower() in {t.lower() for t in inter})


def test_help_explains_every_flag(monkeypatch, capsys):
    import argparse

    class Captured(Exception):
        pass

    def capture(parser, *args, **kwargs):
        raise Captured(parser)

    scripts = sorted(SCRIPTS.glob("0*.py"))
    assert [s.name for s in scripts] == ["01_diagnosis_margin.py", "02_pathA_ccs_matdetector.py",
                                         "02_pathA_ccs_regex.py", "03_pathB_finch.py", "04_merge_cconf.py"]
    for script in scripts:
        module = load_script(script.name)
        with pytest.raises(SystemExit):
            module.parse_args(["--help"])
        assert "--pct" in capsys.readouterr().out
        with monkeypatch.context() as m:
            m.setattr(argparse.ArgumentParser, "parse_args", capture)
            with pytest.raises(Captured) as exc:
                module.parse_args([])
        parser = exc.value.args[0]
        undocumented = [a.option_strings for a in parser._actions if not (a.help and a.help.strip())]
        assert not undocumented, (script.name, undocumented)


def test_refusals(pipeline, tmp_path, capsys):
    run = pipeline["run"]
    err = refused("02_pathA_ccs_regex.py", "--pct", "20", "--dia_out_dir", str(run), "--out_dir", str(tmp_path / "a"),
                  capsys=capsys)
    assert "percentile 20 is not part of the diagnosis run" in err and "--pct 20" in err
    err = refused("02_pathA_ccs_regex.py", "--dia_out_dir", str(tmp_path / "nothing"), capsys=capsys)
    assert "no diagnosis meta" in err
    err = refused("02_pathA_ccs_regex.py", "--pct", "30", "--dia_out_dir", str(run), "--train_pt",
                  str(tmp_path / "missing.jsonl"), "--out_dir", str(tmp_path / "a"), capsys=capsys)
    assert "missing.jsonl" in err

    bad_cache = tmp_path / "short.pt"
    torch.save(torch.zeros(39, 64, dtype=torch.float16), bad_cache)
    err = refused("03_pathB_finch.py", "--dia_out_dir", str(run), "--train_query_cache", str(bad_cache),
                  "--out_dir", str(tmp_path / "b"), "--device", "cpu", capsys=capsys)
    assert "has 40 queries" in err

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    with open(copy / dg.confused_name(30), "a") as fh:
        fh.write("\n")
    err = refused("03_pathB_finch.py", "--dia_out_dir", str(copy), "--device", "cpu", capsys=capsys)
    assert "content differs" in err


def test_new_adapter_recomputes_and_stale_stages_are_refused(pipeline, tmp_path, capsys, monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    monkeypatch.setenv("REPAIR_CACHE", pipeline["env"]["REPAIR_CACHE"])
    run = tmp_path / "run"
    shutil.copytree(pipeline["run"], run)
    old_meta = read_json(run / dg.META_FILE)
    torch.manual_seed(0)
    lora = get_peft_model(AutoModel.from_pretrained(pipeline["model"]),
                          LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    s = run_inprocess("01_diagnosis_margin.py", "--train_pt", str(T0), "--out_dir", str(run), "--model",
                      str(pipeline["model"]), "--adapter", str(tmp_path / "adapter"), "--top_k", str(TOP_K),
                      "--max_length", "64", "--device", "cpu", "--pct", "30")
    assert s["forward_texts"] == 78 and not s["reused_embeddings"] and not s["reused_search"]
    assert s["run_key"] != old_meta["run_key"] and s["fingerprint"] != old_meta["fingerprint"]
    meta = read_json(run / dg.META_FILE)
    assert set(meta["percentiles"]) == {"30"}  # the old 40% file is no longer part of the run
    assert meta["percentiles"]["30"]["sha256"] != old_meta["percentiles"]["30"]["sha256"]
    assert meta["model"]["identity"]["adapter"]
    # PathA/PathB outputs in the folder were made from the previous run: every later stage refuses them
    err = refused("03_pathB_finch.py", "--dia_out_dir", str(run), "--device", "cpu", capsys=capsys)
    assert "written from diagnosis run" in err and "rerun" in err
    err = refused("04_merge_cconf.py", "--dia_out_dir", str(run), capsys=capsys)
    assert "written from diagnosis run" in err
    err = refused("02_pathA_ccs_regex.py", "--pct", "40", "--dia_out_dir", str(run), capsys=capsys)
    assert "percentile 40 is not part" in err
    # the old query cache (another model) is refused by 03
    err = refused("03_pathB_finch.py", "--dia_out_dir", str(run), "--device", "cpu", "--train_query_cache",
                  str(pipeline["run"] / old_meta["pathB"]["train_query_cache"]), capsys=capsys)
    assert "embeddings of model/run" in err
    # after rerunning PathA, PathB and the merge, the chain is consistent again
    run_inprocess("02_pathA_ccs_regex.py", "--dia_out_dir", str(run), "--top_neg_n", str(TOP_NEG_N))
    err = refused("04_merge_cconf.py", "--dia_out_dir", str(run), capsys=capsys)
    assert "written from diagnosis run" in err  # PathB is still the old one
    run_inprocess("03_pathB_finch.py", "--dia_out_dir", str(run), "--device", "cpu")
    assert run_inprocess("04_merge_cconf.py", "--dia_out_dir", str(run))["union_total"] >= 1
    # PathA rerun with other settings -> PathB no longer matches it
    run_inprocess("02_pathA_ccs_regex.py", "--dia_out_dir", str(run), "--top_neg_n", "2")
    err = refused("04_merge_cconf.py", "--dia_out_dir", str(run), capsys=capsys)
    assert "computed from other PathA concepts" in err
