"""bench/scale.py (issue 41, item 5): the log-log slope fit, the flag on a stage that grows too fast, the merge of
measurement files, the projection to the paper's scale, the synthetic corpus, and one real measurement in a fresh
subprocess."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "scale.py"


@pytest.fixture(scope="module")
def scale():
    spec = importlib.util.spec_from_file_location("bench_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(stage, engine, size, seconds, threads=1, **extra):
    base = {"stage": stage, "engine": engine, "size": size, "unit": "x", "threads": threads, "seconds": seconds,
            "peak_rss_mb": 100.0, "rss_anon_mb": 50.0, "queries_per_s": None, "rss_file_mb": 10.0, "disk_mb": None}
    return {**base, **extra}


def test_slope_of_a_power_law_is_its_exponent(scale):
    slope, intercept = scale.fit_slope([10, 100, 1000], [0.003 * s ** 1.5 for s in [10, 100, 1000]])
    assert slope == pytest.approx(1.5, abs=1e-9)
    assert 10 ** intercept == pytest.approx(0.003, rel=1e-9)
    assert scale.fit_slope([10, 10], [1.0, 2.0]) is None  # one distinct size: no slope


def test_a_stage_growing_faster_than_its_algorithm_is_flagged(scale):
    sizes = [1_000, 10_000, 100_000]
    rows = ([row("04", "merge", s, 1e-6 * s ** 2) for s in sizes]            # merge must be ~linear: flagged
            + [row("03", "finch:exact", s, 1e-8 * s ** 2) for s in sizes]   # exact 1-NN is n^2: not flagged
            + [row("01", "search:torch,corpus=100000", s, 1e-4 * s) for s in sizes]
            + [row("01", "margins:torch", s, 1e-8 * s ** 2) for s in sizes])
    assert scale.flagged(rows) == [("04", "merge", 2.0)]
    text = scale.report(rows)
    assert "04 merge" in text and "slope 2.00" in text and "FLAG" in text
    assert scale.expected_slope("01", "search:torch,corpus=100000")[0] == 1.0
    assert scale.expected_slope("01", "margins:torch[search]")[0] == 2.0


def test_merge_replaces_same_key_and_keeps_the_rest(scale):
    old = [row("01", "margins:torch", 1000, 1.0), row("02", "ccs", 1000, 2.0),
           row("02", "ccs", 1000, 3.0, threads=2)]
    new = [row("02", "ccs", 1000, 9.0), row("03", "finch:exact", 1000, 4.0)]
    merged = scale.merge_rows(old, new)
    got = {(r["stage"], r["engine"], r["size"], r["threads"]): r["seconds"] for r in merged}
    assert got == {("01", "margins:torch", 1000, 1): 1.0, ("02", "ccs", 1000, 1): 9.0,
                   ("02", "ccs", 1000, 2): 3.0, ("03", "finch:exact", 1000, 1): 4.0}
    assert [r["stage"] for r in merged] == ["01", "02", "02", "03"]


def test_projection_to_the_papers_scale_from_06_rows(scale):
    sizes = [10_000, 100_000, 1_000_000]
    rows = ([row("06_build", "tantivy", s, 1e-4 * s, disk_mb=s / 3000) for s in sizes]
            + [row("06_search", "tantivy", s, 10.0 * (s / 1e6) ** 0.5, unit="papers (1000 queries)",
                   rss_anon_mb=200.0, rss_file_mb=s / 3000) for s in sizes])
    (p,) = scale.project(rows)
    assert p["index_gb"] == pytest.approx(2e8 / 3000 / 1024, rel=1e-3)
    assert p["build_hours"] == pytest.approx(1e-4 * 2e8 / 3600, rel=1e-3)
    # 1000 queries take 10 s * sqrt(200) at 2e8 papers -> seconds per 10^6 queries
    per_million = 10.0 * math.sqrt(200) / 1000 * 1e6
    assert p["verify_hours_per_1e6_queries"] == pytest.approx(per_million / 3600, rel=1e-2)
    assert p["search_rss_anon_gb"] == pytest.approx(200 / 1024, abs=0.01)  # GB, 2 decimals
    assert "index_gb" in scale.project_text(rows)


def test_synthetic_corpus_is_streamed_gzip_jsonl_and_deterministic(scale, tmp_path):
    path = scale.write_corpus(tmp_path / "c.jsonl.gz", 25, seed=3, chunk=10)
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        papers = [json.loads(line) for line in fh]
    assert [p["id"] for p in papers] == [f"p{i}" for i in range(25)]
    assert all(set(p) == {"id", "title", "abstract"} and len(p["abstract"].split()) == 160 for p in papers)
    again = scale.write_corpus(tmp_path / "d.jsonl.gz", 12, seed=3, chunk=10)
    with gzip.open(again, "rt", encoding="utf-8") as fh:
        assert [json.loads(line) for line in fh] == papers[:12]  # a smaller corpus is a prefix of a larger one
    gen = scale.TextGen(seed=3)
    queries = gen.queries(scale.chunk_rng(3, "q", 0), 50)
    assert all(15 <= len(q.split()) <= 25 for q in queries)


def test_one_real_measurement_in_a_fresh_process_merged_into_the_file(tmp_path):
    out = tmp_path / "scale.json"
    earlier = row("10", "train:tiny-qwen2,gb16", 10, 5.0)
    out.write_text(json.dumps([earlier]))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--stages", "04", "--sizes", "2000", "--merge",
                           "--work_dir", str(tmp_path / "work"), "--output", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert rows[-1] == earlier  # another stage's earlier row is kept
    (measured,) = [r for r in rows if r["stage"] == "04"]
    assert set(measured) == {"stage", "engine", "size", "unit", "threads", "seconds", "peak_rss_mb",
                             "rss_anon_mb", "queries_per_s", "rss_file_mb", "disk_mb"}
    assert (measured["engine"], measured["size"], measured["unit"], measured["threads"]) == (
        "merge", 2000, "confused queries", 1)
    assert measured["seconds"] > 0 and measured["queries_per_s"] is None
    # the child's own memory: a Python process with numpy loaded holds tens of MB, not zero or the parent's
    assert 20 < measured["rss_anon_mb"] <= measured["peak_rss_mb"] < 4000
    assert "04 merge" in proc.stdout and "slope" in proc.stdout
