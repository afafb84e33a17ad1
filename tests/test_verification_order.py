"""06's output is a function of its inputs only (issue 18 item 2).

The same generated file is verified through a local Semantic Scholar server (a) fault-free with one key,
(b) with two keys (two workers), answers that take different times (so items finish out of input order)
and 429s, (c) stopped by --max_items and resumed, (d) with the request of a query whose positive a later
query shares failing, then --resume. All four outputs must be byte-identical: the "duplicate" verdict
(one positive used once) must land on the same query, and the lines must come in the same order.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from repair.data import read_jsonl
from repair.expansion.cli import verification_main
from repair.expansion.verification import read_status
from tests.helpers_sources import FakeServer, Reply, s2_paper, s2_route

FIX = Path(__file__).parent / "fixtures" / "expansion"
PAPERS, GENERATED = FIX / "papers.jsonl", FIX / "generated.jsonl"
KEYS = ["order-key-1", "order-key-2"]
ROWS = read_jsonl(GENERATED)


class FaultyS2:
    """The S2 route behind 127.0.0.1 with injected timing and faults, keyed on the query text:
    ``slow`` queries answer after 0.15 s, ``first_429`` ones get one 429 first, ``fail_once`` ones one 500."""

    def __init__(self, slow: set[str] = frozenset(), first_429: set[str] = frozenset(),
                 fail_once: set[str] = frozenset()):
        papers = [s2_paper(i, r["title"], r["abstract"] or None) for i, r in enumerate(read_jsonl(PAPERS))]
        self.normal = s2_route(papers, set(KEYS))
        self.slow, self.first_429, self.fail_once = slow, first_429, fail_once
        self.seen: dict[str, int] = {}
        self.statuses: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, req) -> Reply:
        q = req.query.get("query", "")
        with self._lock:
            self.seen[q] = n = self.seen.get(q, 0) + 1
        if n == 1 and q in self.first_429:
            reply = Reply(429, {"message": "Too Many Requests"}, {"Retry-After": "0.1"})
        elif n == 1 and q in self.fail_once:
            reply = Reply(500, {"message": "Internal Server Error"})
        else:
            reply = self.normal(req)
            reply.delay = 0.15 if q in self.slow else 0.0
        self.statuses.append(reply.status)
        return reply


def _verify(route: FaultyS2, out: Path, keys: list[str], monkeypatch, capsys, *extra: str) -> dict:
    monkeypatch.setenv("S2_API_KEY", ",".join(keys))
    with FakeServer(route) as srv:
        code = verification_main("semantic_scholar", [
            "--generated_jsonl", str(GENERATED), "--out_jsonl", str(out), "--api_url", srv.url + "/graph/v1",
            "--target_k", "3", "--rate", "0", "--backoff", "0.01", "--cache_dir", "none", "--no_progress", *extra])
        used = {r.headers.get("x-api-key") for r in srv.requests}
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary["keys_used"] = used
    return summary


def _shared_positive(tmp_path: Path, monkeypatch, capsys) -> tuple[str, str]:
    """(earlier id, later id) of two queries whose top hit is the same paper, in input order."""
    everything = tmp_path / "all.jsonl"
    _verify(FaultyS2(), everything, KEYS[:1], monkeypatch, capsys, "--allow_duplicate_positives")
    holder: dict[str, str] = {}
    for rec in read_jsonl(everything):
        if rec["pos_meta"]["id"] in holder:
            return holder[rec["pos_meta"]["id"]], rec["id"]
        holder[rec["pos_meta"]["id"]] = rec["id"]
    pytest.fail("the fixture has no two queries with the same positive: the test would prove nothing")


def test_output_bytes_do_not_depend_on_keys_faults_or_resumes(tmp_path, monkeypatch, capsys):
    query = {r["id"]: r["query"] for r in ROWS}
    earlier, later = _shared_positive(tmp_path, monkeypatch, capsys)

    reference = tmp_path / "a.jsonl"  # (a) one key, no fault
    _verify(FaultyS2(), reference, KEYS[:1], monkeypatch, capsys)
    statuses = read_status(str(reference) + ".status.jsonl")
    assert statuses[earlier]["status"] == "ok" and statuses[later]["status"] == "duplicate"
    expected = reference.read_bytes()

    # (b) two keys = two workers; every other query slow, so answers arrive out of input order; 429s
    faulty = FaultyS2(slow={r["query"] for r in ROWS[0::2]}, first_429={r["query"] for r in ROWS[1::3]})
    two_keys = tmp_path / "b.jsonl"
    summary = _verify(faulty, two_keys, KEYS, monkeypatch, capsys)
    assert summary["keys_used"] == set(KEYS) and 429 in faulty.statuses
    assert two_keys.read_bytes() == expected

    # (c) interrupted by --max_items, then resumed
    stepped = tmp_path / "c.jsonl"
    _verify(FaultyS2(), stepped, KEYS[:1], monkeypatch, capsys, "--max_items", "5")
    assert 0 < len(read_jsonl(stepped)) < len(read_jsonl(reference))
    _verify(FaultyS2(), stepped, KEYS, monkeypatch, capsys, "--resume")
    assert stepped.read_bytes() == expected

    # (d) the earlier query of the shared positive fails, the later one takes the positive, --resume retries
    failing = tmp_path / "d.jsonl"
    first = _verify(FaultyS2(fail_once={query[earlier]}), failing, KEYS, monkeypatch, capsys, "--max_retries", "0")
    assert first["processed"]["failed"] == 1
    assert read_status(str(failing) + ".status.jsonl")[later]["status"] == "ok"
    resumed = _verify(FaultyS2(), failing, KEYS, monkeypatch, capsys, "--resume")
    assert resumed["demoted_to_duplicate"] == 1 and resumed["processed"] == {"ok": 1}
    assert failing.read_bytes() == expected
    after = read_status(str(failing) + ".status.jsonl")
    assert after[earlier]["status"] == "ok" and after[later]["status"] == "duplicate"
    assert earlier in after[later]["reason"]
    # and a further --resume changes nothing
    _verify(FaultyS2(), failing, KEYS, monkeypatch, capsys, "--resume")
    assert failing.read_bytes() == expected
