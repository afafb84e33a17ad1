"""Generation over several OpenAI-compatible servers (issue 42), each a real server process on 127.0.0.1
(tests/openai_server_proc.py): the outputs equal the one-server run's, requests spread over the servers with a bounded
number in flight on each, and a server that dies mid-run costs its in-flight requests, not the run (same outputs).
Through the library (05's generator, 06d's judge) and through 05's command line with ``--openai_url A,B``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from repair.expansion.generation import OpenAIGenerator
from repair.expansion.relevance_judge import JudgeCache, RelevanceJudge
from repair.expansion.server_pool import split_urls

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "openai_server_proc.py"
PROMPTS = [f"Write one research query about concept {i} and its {['gap', 'film', 'dopant'][i % 3]}."
           for i in range(24)]


class ServerProc:
    """One server process; ``url`` once it listens; stopped (if still alive) on exit."""

    def __init__(self, tmp: Path, name: str, *extra: str):
        self.port_file = tmp / f"{name}.url"
        self.proc = subprocess.Popen([sys.executable, str(SERVER), "--port_file", str(self.port_file), *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self.port_file.exists() or not self.port_file.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, "test server did not start"
            time.sleep(0.05)
        self.url = self.port_file.read_text()

    def stats(self) -> dict:
        return requests.get(self.url.removesuffix("/v1") + "/stats", timeout=10).json()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture()
def servers(tmp_path):
    started: list[ServerProc] = []

    def start(name: str, *extra: str) -> ServerProc:
        started.append(ServerProc(tmp_path, name, *extra))
        return started[-1]

    yield start
    for server in started:
        server.close()


def generate(url: str, concurrency: int = 2) -> tuple[list[str], OpenAIGenerator]:
    gen = OpenAIGenerator(url, model="pool-model", concurrency=concurrency, backoff_base=0.05, timeout=20)
    return gen.generate(PROMPTS, n=2, seed=11, max_new_tokens=32), gen


def test_split_urls():
    assert split_urls("http://a:1/v1, http://b:2/v1,http://a:1/v1") == ["http://a:1/v1", "http://b:2/v1"]
    assert split_urls("http://a:1/v1") == ["http://a:1/v1"]


def test_two_servers_give_the_one_server_outputs_with_bounded_requests_in_flight(servers, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    a, b = servers("a", "--delay", "0.05"), servers("b", "--delay", "0.05")
    one, _ = generate(a.url)
    two, gen = generate(f"{a.url},{b.url}")
    assert len(one) == 2 * len(PROMPTS) and len(set(one)) > len(PROMPTS)  # distinct seeds, distinct texts
    assert two == one
    answered = gen.client.answered()
    assert sorted(answered.values())[0] >= 4 and sum(answered.values()) == len(PROMPTS)  # both did real work
    assert a.stats()["max_in_flight"] <= 2 and b.stats()["max_in_flight"] <= 2  # --concurrency 2 per server
    assert b.stats()["max_in_flight"] == 2  # and the bound was reached: 4 threads over 2 servers


def test_a_server_dying_mid_run_costs_its_requests_not_the_run(servers, monkeypatch, caplog):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    a = servers("a", "--delay", "0.05")
    one, _ = generate(a.url)
    dying = servers("dying", "--delay", "0.05", "--die_after", "5")
    two, gen = generate(f"{dying.url},{a.url}")
    assert dying.proc.wait(timeout=30) == 3  # it did die, with requests in flight
    assert two == one
    assert gen.client.stats["failed_over"] >= 1
    assert gen.client.answered()[dying.url.removesuffix("/v1")] < 5
    assert any("skipping it" in r.message for r in caplog.records)


def test_judge_over_two_servers_one_dying_gives_the_one_server_probabilities(servers, tmp_path, monkeypatch):
    """06d's path: one-token requests with logprobs through the same pool."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    a, b = servers("a", "--delay", "0.05"), servers("b", "--delay", "0.05")
    triples = [(f"query {i}", f"Title {i}", f"Abstract about item {i} and its properties.") for i in range(16)]

    def probabilities(url: str, cache: str) -> list[float]:
        gen = OpenAIGenerator(url, model="pool-model", concurrency=2, backoff_base=0.05, timeout=20)
        judge = RelevanceJudge(gen, JudgeCache(tmp_path / cache), batch_size=8)
        return [r["p_yes"] for r in judge.probabilities(triples)]

    one = probabilities(a.url, "one.jsonl")
    assert probabilities(f"{a.url},{b.url}", "ab.jsonl") == one
    assert b.stats()["max_in_flight"] == 2 and a.stats()["max_in_flight"] == 2  # 2 per server, both kept busy
    dying = servers("dying", "--die_after", "3")
    assert probabilities(f"{dying.url},{a.url}", "two.jsonl") == one
    assert len(set(one)) > 8


def run_05(url: str, out: Path, concepts: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "expansion" / "05_query_generation.py"), "--backend", "openai", "--openai_url",
           url, "--concept_txt", str(concepts), "--out_jsonl", str(out), "--num_queries", "12", "--round_size", "6",
           "--seed", "7", "--concurrency", "2", "--no_progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OPENAI_API_KEY": ""}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_05_with_two_servers_one_dying_writes_the_one_server_file(servers, tmp_path):
    concepts = tmp_path / "concepts.txt"
    concepts.write_text("graphene\nperovskite solar cell\nTiO2 photocatalysis\ngut microbiota\n")
    a = servers("a", "--delay", "0.02")
    run_05(a.url, tmp_path / "one.jsonl", concepts)
    dying = servers("dying", "--delay", "0.02", "--die_after", "4")
    summary = run_05(f"{dying.url},{a.url}", tmp_path / "two.jsonl", concepts)
    assert dying.proc.wait(timeout=30) == 3
    assert summary["generator"]["base_url"] == f"{dying.url},{a.url}"
    rows = lambda p: [json.loads(line) for line in p.read_text().splitlines()]  # noqa: E731
    assert rows(tmp_path / "two.jsonl") == rows(tmp_path / "one.jsonl") and len(rows(tmp_path / "one.jsonl")) >= 6
