"""Stage II end to end: the verification rule, 06 over the local corpus and a fake Semantic Scholar (resume,
failed-then-retried items, fatal key errors, --target_valid, concept mode), 06 killed mid-run and resumed,
05 with a tiny local model (stable ids across resumes) and with an OpenAI-compatible server plus PubChem /
Materials Project grounding, and planted API keys that must not reach any output file or log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repair.data import DataError, read_jsonl
from repair.expansion.concept_search import concept_groups_to_tuples, run_concept_mode
from repair.expansion.cli import verification_main
from repair.expansion.query_generation import Grounder, read_concepts
from repair.expansion.sources import AuthError
from repair.expansion.sources.base import Paper
from repair.expansion.sources.local_corpus import LocalCorpus
from repair.expansion.sources.semantic_scholar import SemanticScholar
from repair.expansion.verification import count_valid, read_status, run_verification, verify_hits
from tests.helpers_generation import build_tiny_causal
from tests.helpers_sources import (FakeServer, Reply, mp_route, openai_route, pubchem_route, s2_paper, s2_route)

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "expansion"
PAPERS, GENERATED, CONCEPTS = FIX / "papers.jsonl", FIX / "generated.jsonl", FIX / "concepts.txt"
CORPUS = {r["id"]: r for r in read_jsonl(PAPERS)}
N_GENERATED = len(read_jsonl(GENERATED))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> LocalCorpus:
    return LocalCorpus(PAPERS, index_dir=tmp_path_factory.mktemp("bm25") / "idx")


def P(i, abstract="abs", doi=None, title=None):
    return Paper(id=f"id{i}", title=title or f"Title {i}", abstract=abstract, doi=doi, source="x")


# ---------------------------------------------------------------------------------------------- the rule
def test_verify_hits_rule():
    row = {"id": "r0-0", "query": "q", "concepts": ["c"]}
    assert verify_hits(row, [], 5, "x").status == "no_hits"
    assert verify_hits(row, [P(0, ""), P(1, " ")], 5, "x").status == "no_abstract"
    hits = [P(0, ""), P(1, "positive text", doi="10.1/A"), P(2, "n2"), P(3, "dup", doi="10.1/a"),
            P(4, "positive text"), P(5, ""), P(6, "n6"), P(7, "n7")]
    v = verify_hits(row, hits, 2, "local_corpus")
    assert v.status == "ok"
    rec = v.record
    assert rec["q_new"] == "Title 1" and rec["d_pos"] == "positive text" and rec["pos_rank"] == 2
    assert rec["pos_meta"] == {"id": "id1", "doi": "10.1/A", "title": "Title 1", "year": None, "venue": None,
                               "url": None}
    # no abstract-less paper, no copy of the positive (same DOI, same abstract); capped at target_k
    assert [n["id"] for n in rec["negative_candidates"]] == ["id2", "id6"]
    assert rec["q_model"] == "q" and rec["concepts"] == ["c"] and rec["source"] == "local_corpus"
    assert verify_hits(row, hits, 2, "x", used_positives={"doi:10.1/a"}).status == "duplicate"
    # --require_concept: the top hit with an abstract that names a concept ("c" as a whole term)
    anchored = [P(1, "no concept here"), P(2, "about c-type lectins"), P(3, "about c itself")]
    assert verify_hits(row, anchored, 2, "x", require_concept=True).record["pos_meta"]["id"] == "id2"
    assert verify_hits({**row, "concepts": ["lectin"]}, anchored, 2, "x", require_concept=True).status == \
        "off_concept"


# ---------------------------------------------------------------------------------------------- 06 local
def _check_tuples(records: list[dict]) -> None:
    for rec in records:
        paper = CORPUS[rec["pos_meta"]["id"]]
        assert rec["q_new"] == paper["title"] and rec["d_pos"] == paper["abstract"] != ""
        for neg in rec["negative_candidates"]:
            assert neg["abstract"] and neg["abstract"] != rec["d_pos"] and neg["id"] != rec["pos_meta"]["id"]
            assert CORPUS[neg["id"]]["abstract"] == neg["abstract"]


def test_local_verification_and_resume(local, tmp_path):
    out = tmp_path / "exp.jsonl"
    stats = run_verification(local, GENERATED, out, target_k=3, progress=False)
    recs = read_jsonl(out)
    status = read_status(str(out) + ".status.jsonl")
    assert len(status) == N_GENERATED
    assert status["r0-2"]["status"] == "no_hits"  # nonsense words: no paper shares a term
    by_id = {r["id"]: r for r in recs}
    assert by_id["r0-1"]["pos_meta"]["id"] == "p03"  # venetoclax / BCL-2
    assert by_id["r0-3"]["pos_meta"]["id"] == "p05"  # hematite Fe2O3
    assert by_id["r2-1"]["pos_meta"]["id"] == "p21"  # NaCl habit
    assert all(len(r["negative_candidates"]) <= 3 for r in recs)
    _check_tuples(recs)
    positives = [r["pos_meta"]["id"] for r in recs]
    assert len(positives) == len(set(positives))  # a positive is used once; later hits are "duplicate"
    assert stats.counts["ok"] == len(recs) == count_valid(out)
    assert sum(stats.counts.values()) == N_GENERATED
    with pytest.raises(FileExistsError):
        run_verification(local, GENERATED, out, progress=False)
    again = run_verification(local, GENERATED, out, resume=True, progress=False)
    assert again.skipped_done == N_GENERATED and sum(again.counts.values()) == 0
    assert read_jsonl(out) == recs


def test_target_valid_stops_then_resume_completes(local, tmp_path):
    full = tmp_path / "full.jsonl"
    run_verification(local, GENERATED, full, target_k=3, progress=False)
    part = tmp_path / "part.jsonl"
    stats = run_verification(local, GENERATED, part, target_k=3, target_valid=3, progress=False)
    assert count_valid(part) == 3 and "target_valid" in stats.stopped
    run_verification(local, GENERATED, part, target_k=3, resume=True, progress=False)
    assert read_jsonl(part) == read_jsonl(full)


# ---------------------------------------------------------------------------------------------- 06 remote
def _s2_papers() -> list[dict]:
    return [s2_paper(i, r["title"], r["abstract"] or None) for i, r in enumerate(CORPUS.values())]


def test_failed_items_are_recorded_and_retried_on_resume(tmp_path):
    gen = read_jsonl(GENERATED)
    with FakeServer(s2_route(_s2_papers())) as srv:
        srv.queue += [Reply(500, {"message": "Internal Server Error"})] * 2  # the first two items fail
        client = SemanticScholar(srv.url + "/graph/v1", keys=[], rate=None, max_retries=0)
        out = tmp_path / "s2.jsonl"
        first = run_verification(client, GENERATED, out, target_k=4, progress=False)
        status = read_status(str(out) + ".status.jsonl")
        assert first.counts["failed"] == 2
        assert [status[g["id"]]["status"] for g in gen[:2]] == ["failed", "failed"]
        assert "HTTP 500" in status[gen[0]["id"]]["reason"]
        assert gen[0]["id"] not in {r["id"] for r in read_jsonl(out)}  # never written as "zero results"
        n_before = len(srv.requests)
        second = run_verification(client, GENERATED, out, target_k=4, resume=True, progress=False)
        retried = len(srv.requests) - n_before
    assert second.skipped_done == N_GENERATED - 2 and retried == 2
    after = read_status(str(out) + ".status.jsonl")
    assert {after[g["id"]]["status"] for g in gen[:2]} <= {"ok", "duplicate", "no_hits"}
    ids = [r["id"] for r in read_jsonl(out)]
    assert len(ids) == len(set(ids)) == sum(s["status"] == "ok" for s in after.values())
    assert all(r["source"] == "semantic_scholar" for r in read_jsonl(out))


def test_timeouts_are_retried_then_recorded_as_failed(tmp_path):
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in read_jsonl(GENERATED)[:2]))
    with FakeServer(s2_route(_s2_papers())) as srv:
        srv.slow_all = 0.5
        client = SemanticScholar(srv.url + "/graph/v1", keys=[], rate=None, timeout=0.1, max_retries=1,
                                 backoff_base=0.01)
        stats = run_verification(client, gen, tmp_path / "s2.jsonl", progress=False)
        assert len(srv.requests) == 4  # two items, one retry each
    status = read_status(tmp_path / "s2.jsonl.status.jsonl")
    assert stats.counts == {"failed": 2} and all("timed out" in s["reason"] for s in status.values())
    assert count_valid(tmp_path / "s2.jsonl") == 0


def test_fatal_key_error_stops_without_recording_items(tmp_path):
    with FakeServer(s2_route(_s2_papers(), keys={"good"})) as srv:
        client = SemanticScholar(srv.url + "/graph/v1", keys=["bad-key-XYZ"], rate=None)
        out = tmp_path / "s2.jsonl"
        with pytest.raises(AuthError) as err:
            run_verification(client, GENERATED, out, progress=False)
    assert "semantic_scholar" in str(err.value) and "bad-key-XYZ" not in str(err.value)
    assert read_status(str(out) + ".status.jsonl") == {} and count_valid(out) == 0


def test_4xx_is_refused_once_and_an_overlong_query_is_capped(tmp_path):
    """A 4xx other than 429/401/403 is permanent: recorded as "refused", counted, never asked again by --resume.
    A 200,000-character "query" (a broken 05 line) goes out capped at MAX_QUERY_CHARS: before, it went out
    whole as a URL, got 414 and was retried on every resume."""
    from repair.expansion.sources.base import MAX_QUERY_CHARS

    long_query = "graphene mobility " + "filler " * 30_000
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q-long", "query": long_query}, {"id": "q-bad", "query": "zxcvbnm perovskite"}]))
    normal = s2_route(_s2_papers())
    sent: list[str] = []

    def route(req):
        sent.append(req.query.get("query", ""))
        if "zxcvbnm" in sent[-1]:
            return Reply(400, {"error": "Unsupported query syntax"})
        return normal(req)

    out = tmp_path / "s2.jsonl"
    with FakeServer(route) as srv:
        client = SemanticScholar(srv.url + "/graph/v1", keys=[], rate=None, backoff_base=0.01)
        stats = run_verification(client, gen, out, target_k=3, progress=False)
        n_sent = len(sent)
        again = run_verification(client, gen, out, target_k=3, resume=True, progress=False)
        assert len(sent) == n_sent  # nothing asked again: the 400 is not retried
    status = read_status(str(out) + ".status.jsonl")
    assert status["q-bad"]["status"] == "refused" and status["q-bad"]["http_status"] == 400
    assert "Unsupported query syntax" in status["q-bad"]["reason"]
    assert stats.counts == {"ok": 1, "refused": 1} and again.skipped_done == 2
    assert stats.as_dict()["processed"]["refused"] == 1  # in the summary 06 prints
    assert max(len(q) for q in sent) <= MAX_QUERY_CHARS and status["q-long"]["status"] == "ok"
    long_rec = next(r for r in read_jsonl(out) if r["id"] == "q-long")
    assert long_rec["q_model"] == long_query[:len(long_rec["q_model"])] and len(long_rec["q_model"]) <= 512


def test_empty_or_inconsistent_generated_file_is_a_clear_error(local, tmp_path, caplog):
    gen = tmp_path / "generated.jsonl"
    gen.write_text("")
    out = tmp_path / "exp.jsonl"
    with pytest.raises(DataError, match=rf"{gen}: holds no generated query: 05 produced nothing"):
        verification_main("local_corpus", ["--corpus", str(PAPERS), "--index_dir", str(tmp_path / "idx"),
                                           "--generated_jsonl", str(gen), "--out_jsonl", str(out), "--no_progress"])
    assert not out.exists()
    # legitimate: 05 ran to the end of a round and rejected every completion -> a warning, nothing to do
    (tmp_path / "generated.jsonl.rounds.jsonl").write_text(json.dumps(
        {"round": 0, "generated": 2, "accepted": 0, "rejected": [{"id": "r0-0", "reason": "vague", "raw": "x"},
                                                                 {"id": "r0-1", "reason": "empty", "raw": ""}]}) + "\n")
    stats = run_verification(local, gen, out, progress=False)
    assert sum(stats.counts.values()) == 0 and "rejected all 2 completions" in caplog.text
    # a repeated id would make resume and input order ambiguous: the file and both lines are named
    rows = read_jsonl(GENERATED)[:3]
    gen.write_text("".join(json.dumps(r) + "\n" for r in [*rows, rows[1]]))
    with pytest.raises(DataError, match=rf"{gen}:4: field 'id': '{rows[1]['id']}' repeats line 2"):
        run_verification(local, gen, tmp_path / "other.jsonl", progress=False)


# ---------------------------------------------------------------------------------------------- concept mode
def test_concept_mode_original_lines_and_conversion(local, tmp_path):
    concepts = read_concepts(CONCEPTS)
    assert concepts == ["graphene", "Fe2O3", "Aspirin", "mantle cell lymphoma", "TiO2", "zxqv"]
    out = tmp_path / "concepts.jsonl"
    run_concept_mode(local, concepts, out, target_k=3, progress=False)
    lines = {r["concept"]: r for r in read_jsonl(out)}
    assert lines["zxqv"]["got_k"] == 0 and lines["zxqv"]["papers"] == []
    g = lines["graphene"]["papers"]
    assert lines["graphene"]["got_k"] == 3 and all(p["abstract"] for p in g)  # abstract-first, p27 pushed out
    assert set(g[0]) == {"pid", "doi", "title", "abstract", "year", "venue", "url", "source"}
    n = concept_groups_to_tuples(out, tmp_path / "tuples.jsonl")
    tuples = read_jsonl(tmp_path / "tuples.jsonl")
    assert n == len(tuples) == sum(len([p for p in r["papers"] if p["abstract"]]) for r in lines.values())
    _check_tuples(tuples)
    t0 = [t for t in tuples if t["q_model"] == "mantle cell lymphoma"]
    assert {t["pos_meta"]["id"] for t in t0} == {p["pid"] for p in lines["mantle cell lymphoma"]["papers"]}


def test_readme_command_runs_concept_mode_and_count_only(tmp_path, capsys):
    out = tmp_path / "exp.jsonl"
    args = ["--concept_txt", str(CONCEPTS), "--corpus", str(PAPERS), "--index_dir", str(tmp_path / "idx"),
            "--out_jsonl", str(out), "--target_k", "2", "--resume", "--no_progress"]
    assert verification_main("local_corpus", args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["mode"] == "concept" and summary["processed"] == {"ok": 4, "no_hits": 2}
    assert verification_main("local_corpus", ["--out_jsonl", str(out), "--count_only"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out_jsonl": str(out), "valid": 4}  # Aspirin, zxqv: no paper


# ---------------------------------------------------------------------------------------------- kill + resume
def _run_06(args: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "expansion" / "06_local_corpus.py"), *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def test_06_killed_mid_run_then_resumed_loses_and_duplicates_nothing(tmp_path):
    common = ["--corpus", str(PAPERS), "--index_dir", str(tmp_path / "idx"), "--generated_jsonl", str(GENERATED),
              "--target_k", "3", "--no_progress"]
    reference = tmp_path / "reference.jsonl"
    assert verification_main("local_corpus", [*common, "--out_jsonl", str(reference)]) == 0
    out = tmp_path / "killed.jsonl"
    status = Path(str(out) + ".status.jsonl")
    proc = _run_06([*common, "--out_jsonl", str(out), "--per_item_sleep", "0.4"])
    deadline = time.time() + 120
    while time.time() < deadline and (not status.exists() or len(status.read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    n_done = len(status.read_text().splitlines())
    assert 3 <= n_done < N_GENERATED, "the run was not interrupted mid-way"
    resumed = _run_06([*common, "--out_jsonl", str(out), "--resume"])
    stdout, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["skipped_done"] >= 3
    got, ref = read_jsonl(out), read_jsonl(reference)
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in ref)  # none lost, none twice
    assert sorted(got, key=lambda r: r["id"]) == sorted(ref, key=lambda r: r["id"])
    assert out.read_bytes() == reference.read_bytes()  # same lines in the same (input) order


# ---------------------------------------------------------------------------------------------- 05
def _run_05(args: list[str]) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("q05", ROOT / "expansion" / "05_query_generation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(args)


@pytest.fixture(scope="module")
def tiny_causal(tmp_path_factory) -> Path:
    return build_tiny_causal(tmp_path_factory.mktemp("tiny_causal_05"))


def test_05_tiny_model_resume_gives_stable_ids(tiny_causal, tmp_path):
    base = ["--concept_txt", str(CONCEPTS), "--model", str(tiny_causal), "--device", "cpu", "--round_size", "3",
            "--seed", "3", "--max_new_tokens", "12", "--no_progress"]
    straight = tmp_path / "straight.jsonl"
    _run_05([*base, "--out_jsonl", str(straight), "--num_queries", "6"])
    stepped = tmp_path / "stepped.jsonl"
    _run_05([*base, "--out_jsonl", str(stepped), "--num_queries", "3"])
    with pytest.raises(FileExistsError):
        _run_05([*base, "--out_jsonl", str(stepped), "--num_queries", "6"])
    summary = _run_05([*base, "--out_jsonl", str(stepped), "--num_queries", "6", "--resume"])
    assert summary["this_run"]["rounds_skipped"] == 1 and summary["this_run"]["rounds_done"] == 1
    assert read_jsonl(stepped) == read_jsonl(straight)
    assert read_jsonl(str(stepped) + ".rounds.jsonl") == read_jsonl(str(straight) + ".rounds.jsonl")
    totals = summary["file_totals"]
    assert totals["generated"] == 6 and totals["accepted"] + sum(totals["rejected"].values()) == 6
    for rec in read_jsonl(straight):
        assert rec["id"] == f"r{rec['round']}-{rec['id'].split('-')[1]}" and 1 <= len(rec["concepts"]) <= 3
        assert set(rec["concepts"]) <= set(read_concepts(CONCEPTS)) and rec["query"].strip()
        assert rec["prompt_id"] == "repair-paper-a2.1-v1" and rec["generator"]["seed"] == 3
    summary = _run_05([*base, "--out_jsonl", str(stepped), "--num_queries", "6", "--resume"])
    assert summary["this_run"]["rounds_done"] == 0 and read_jsonl(stepped) == read_jsonl(straight)
    with pytest.raises(ValueError, match=r"rounds\.jsonl:1: this file was generated with seed=3"):
        _run_05([*base, "--seed", "4", "--out_jsonl", str(stepped), "--num_queries", "9", "--resume"])
    # issue 44: new rounds written by another sampling or another generator would have been appended silently
    with pytest.raises(ValueError, match=r"rounds\.jsonl:1: this file was generated with sampling\.max_new_tokens=12, "
                                         r"not 20; resume with the same settings"):
        _run_05([*base, "--max_new_tokens", "20", "--out_jsonl", str(stepped), "--num_queries", "9", "--resume"])
    other = str(tiny_causal) + "/"  # the same weights named otherwise: another model as far as the file can tell
    with pytest.raises(ValueError, match=r"this file was generated with generator\.model="):
        _run_05([*base, "--model", other, "--out_jsonl", str(stepped), "--num_queries", "9", "--resume"])


def test_05_openai_backend_with_grounding(tmp_path, monkeypatch):
    monkeypatch.setenv("MP_API_KEY", "0123456789abcdef0123456789abcdef")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test")
    prompts = []

    def reply(messages, seed):
        prompts.append(messages[-1]["content"])
        first = messages[-1]["content"].split("Concept 1: ")[1].split(" (")[0]
        return f"Here is your query:\nQuery: How does {first} behave when nobody is looking at it?"

    with FakeServer(openai_route(reply, model="gen-model")) as llm, FakeServer(pubchem_route()) as pc, \
            FakeServer(mp_route(keys={"0123456789abcdef0123456789abcdef"})) as mp:
        summary = _run_05(["--concept_txt", str(CONCEPTS), "--out_jsonl", str(tmp_path / "gen.jsonl"),
                           "--backend", "openai", "--openai_url", llm.url + "/v1", "--num_queries", "8",
                           "--round_size", "4", "--grounding", "both", "--pubchem_url", pc.url + "/rest/pug",
                           "--mp_url", mp.url, "--cache_dir", str(tmp_path / "http"), "--no_progress"])
        n_pubchem = len(pc.requests)
    recs = read_jsonl(tmp_path / "gen.jsonl")
    assert len(recs) == 8 and summary["generator"]["model"] == "gen-model"
    for rec in recs:
        assert rec["query"] == f"How does {rec['concepts'][0]} behave when nobody is looking at it?"
        assert rec["generator"] == {"backend": "openai", "model": "gen-model", "seed": 42}
        for c in rec["concepts"]:
            if c == "Aspirin":
                assert rec["attributes"][c]["pubchem"]["formula"] == "C9H8O4" and "materials_project" not in \
                    rec["attributes"][c]  # C9H8O4 is no MP material: recorded as a grounding error
                assert "materials_project" in rec["grounding_errors"][c]
            elif c == "Fe2O3":
                assert rec["attributes"][c]["materials_project"]["crystal_system"] == "Trigonal"
                assert "pubchem" in rec["grounding_errors"][c]
            elif c == "TiO2":  # the fixture PubChem knows "titanium dioxide", not "TiO2"
                assert rec["attributes"][c]["materials_project"]["crystal_system"] == "Tetragonal"
                assert "pubchem: no compound" in rec["grounding_errors"][c]
            else:
                assert c not in rec["attributes"] and "pubchem: no compound" in rec["grounding_errors"][c]
                assert "is not a chemical formula" in rec["grounding_errors"][c]
    aspirin_prompts = [p for p in prompts if "Aspirin (Attributes" in p]
    if aspirin_prompts:
        assert "molecular weight 180.16 g/mol" in aspirin_prompts[0]
    # each concept is asked once per run (memoised) and the disk cache answers a second run
    assert n_pubchem <= 2 * len(read_concepts(CONCEPTS))


def test_grounder_records_failures_and_turns_off_a_rejected_source():
    class Broken:
        def ground(self, name):
            from repair.expansion.sources import AuthError
            raise AuthError("materials_project", 401, "access refused")

    class Found:
        def ground(self, name):
            return {"source": "pubchem", "formula": "X"} if name == "known" else None

    g = Grounder(pubchem=Found(), materials_project=Broken())
    attrs, err = g.ground("Fe2O3")
    assert attrs == {} and "no compound" in err and "access refused" in err
    assert g.mp is None  # turned off after the fatal error, with one warning
    attrs, err = g.ground("known")
    assert attrs == {"pubchem": {"source": "pubchem", "formula": "X"}} and err is None


# ---------------------------------------------------------------------------------------------- key leaks
def test_planted_keys_never_reach_outputs_or_logs(tmp_path):
    s2_key, openai_key, mp_key = "S2KEY-planted-5b1f0c", "sk-PLANTED-openai-77", "MPKEY-planted-0123456789abcdefghij"
    env = {"S2_API_KEY": s2_key, "OPENAI_API_KEY": openai_key, "MP_API_KEY": mp_key,
           "REPAIR_CACHE": str(tmp_path / "cache")}

    def echo_key_400(req):  # a hostile server that echoes the key in an error
        return Reply(400, {"error": f"bad request from {req.headers.get('x-api-key')}"})

    def s2(req):
        return echo_key_400(req) if "zxcvbnm" in req.query.get("query", "") else s2_route(_s2_papers(), {s2_key})(req)

    with FakeServer(openai_route(lambda m, s: "Query: graphene mobility under pressure in monolayers",
                                 key=openai_key)) as llm, FakeServer(s2) as srv, \
            FakeServer(mp_route(keys={mp_key})) as mp, FakeServer(pubchem_route()) as pc:
        gen = tmp_path / "gen.jsonl"
        r05 = subprocess.run([sys.executable, str(ROOT / "expansion" / "05_query_generation.py"), "--backend",
                              "openai", "--openai_url", llm.url + "/v1", "--concept_txt", str(CONCEPTS),
                              "--out_jsonl", str(gen), "--num_queries", "4", "--round_size", "4", "--grounding",
                              "both", "--mp_url", mp.url, "--pubchem_url", pc.url + "/rest/pug", "--log_level",
                              "DEBUG", "--no_progress"], env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=120)
        assert r05.returncode == 0, r05.stderr
        r06 = subprocess.run([sys.executable, str(ROOT / "expansion" / "06_semantic_scholar.py"),
                              "--generated_jsonl", str(GENERATED), "--out_jsonl", str(tmp_path / "exp.jsonl"),
                              "--api_url", srv.url + "/graph/v1", "--rate", "0", "--max_retries", "0",
                              "--log_level", "DEBUG", "--no_progress"],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
        assert r06.returncode == 0, r06.stderr
        assert any(r.headers.get("x-api-key") == s2_key for r in srv.requests)  # the key was really used
    status = read_status(tmp_path / "exp.jsonl.status.jsonl")
    # a 400 is permanent: "refused" (not retried on --resume), its echoed key scrubbed
    assert status["r0-2"]["status"] == "refused" and status["r0-2"]["http_status"] == 400
    assert "bad request from ***" in status["r0-2"]["reason"]
    texts = [r05.stdout, r05.stderr, r06.stdout, r06.stderr]
    texts += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    for key in (s2_key, openai_key, mp_key):
        assert not any(key in t for t in texts), f"{key} leaked"
