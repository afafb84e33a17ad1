"""Issue 16 lever 2, the query form matched to T0: 06's default output is byte-identical to what it was before the
option existed; ``--query_form generated`` puts the generator's query into q_new with the same positive and
candidates; the T0-style rewrite (06c) with a tiny random causal LM and with an OpenAI-compatible server (examples
drawn from T0 deterministically, ids/d+/candidates kept, failures kept as titles or dropped and counted, resume
writes nothing new and a killed run resumes to the same bytes). Also issue 18's leftover: 06 exits non-zero when
every item of a run failed."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from repair.data import DataError, load_seed, read_jsonl
from repair.expansion.cli import verification_main
from repair.expansion.generation import HFGenerator
from repair.expansion.query_generation import clean_query, shared_content_words
from repair.expansion.sources.local_corpus import LocalCorpus
from repair.expansion.t0_style import (build_t0_style_prompt, draw_t0_examples, query_style, rewrite_t0_style, t0_max_words,
                             t0_query_style)
from repair.expansion.verification import VerificationStats, read_status, run_verification
from tests.helpers_generation import build_tiny_causal
from tests.helpers_sources import FakeServer, Reply, openai_route, s2_paper, s2_route

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
FIX = Path(__file__).parent / "fixtures" / "expansion"
PAPERS, GENERATED = FIX / "papers.jsonl", FIX / "generated.jsonl"
CORPUS = {r["id"]: r for r in read_jsonl(PAPERS)}
# sha256 of 06_local_corpus's output on the fixtures with --target_k 3, computed with the code before --query_form
# existed (commit adeb22f): the default form must keep writing exactly these bytes.
DEFAULT_OUTPUT_SHA256 = "77b36d01ed7385395a92c7ac5d72381a0c82af8b4b09a9eae406cfb5568b2885"
CLAIMS = [  # a SciFact-like T0: claims -> abstracts; the last row's passage is paper p03's abstract
    ("Hall mobility of graphene drops under hydrostatic pressure.", CORPUS["p01"]["abstract"]),
    ("Surface roughness controls fatigue crack initiation in printed titanium lattices.", CORPUS["p02"]["abstract"]),
    ("Cyclin D1 is overexpressed in mantle cell lymphoma.", CORPUS["p04"]["abstract"]),
    ("Titanium doping lowers the onset potential of hematite photoanodes.", CORPUS["p05"]["abstract"]),
    ("APOE4 carriers clear amyloid beta more slowly.", CORPUS["p09"]["abstract"]),
    ("Venetoclax binds BCL-2 with sub-nanomolar affinity.", CORPUS["p03"]["abstract"]),
]


def _local_args(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    return ["--corpus", str(PAPERS), "--index_dir", str(tmp_path / "idx"), "--generated_jsonl", str(GENERATED),
            "--out_jsonl", str(out), "--target_k", "3", "--no_progress", *extra]


# ---------------------------------------------------------------------------------------------- 06 --query_form
def test_default_query_form_output_is_byte_identical_to_before(tmp_path):
    plain, titled = tmp_path / "plain.jsonl", tmp_path / "title.jsonl"
    assert verification_main("local_corpus", _local_args(tmp_path, plain)) == 0
    assert verification_main("local_corpus", _local_args(tmp_path, titled, "--query_form", "title")) == 0
    assert hashlib.sha256(plain.read_bytes()).hexdigest() == DEFAULT_OUTPUT_SHA256
    assert titled.read_bytes() == plain.read_bytes()
    assert all("query_form" not in rec for rec in read_jsonl(plain))


def test_generated_form_puts_the_generated_query_in_q_new(tmp_path):
    local = LocalCorpus(PAPERS, index_dir=tmp_path / "idx")
    title_out, gen_out = tmp_path / "title.jsonl", tmp_path / "generated.jsonl"
    run_verification(local, GENERATED, title_out, target_k=3, progress=False)
    stats = run_verification(local, GENERATED, gen_out, target_k=3, query_form="generated", progress=False)
    generated = {r["id"]: r["query"] for r in read_jsonl(GENERATED)}
    titled, gen = read_jsonl(title_out), read_jsonl(gen_out)
    assert [r["id"] for r in gen] == [r["id"] for r in titled] and stats.counts["ok"] == len(gen) == 13
    for t, g in zip(titled, gen):
        assert g["q_new"] == generated[g["id"]] == g["q_model"] != t["q_new"]
        assert g["query_form"] == "generated" and t["q_new"] == t["pos_meta"]["title"] == g["pos_meta"]["title"]
        assert {k: v for k, v in g.items() if k not in ("q_new", "query_form")} == \
            {k: v for k, v in t.items() if k != "q_new"}  # same d+, candidates, ids, metadata
    by_id = {r["id"]: r for r in gen}
    assert by_id["r0-1"]["q_new"] == "Which guardian of leukemic cell survival does venetoclax silence?"
    assert by_id["r0-1"]["d_pos"] == CORPUS["p03"]["abstract"]
    # the same positives are duplicates in both forms (the dedup key is the paper, not q_new)
    statuses = read_status(str(title_out) + ".status.jsonl"), read_status(str(gen_out) + ".status.jsonl")
    assert {i: s["status"] for i, s in statuses[0].items()} == {i: s["status"] for i, s in statuses[1].items()}
    # two queries whose top hit is the same paper: the second is a duplicate in both forms
    twice = tmp_path / "twice.jsonl"
    twice.write_text("".join(json.dumps({"id": f"q{i}", "query": q}) + "\n" for i, q in enumerate(
        ["Does venetoclax inhibit BCL-2 in leukemia?", "Venetoclax BCL-2 binding affinity in leukemic B cells"])))
    for form in ("title", "generated"):
        out = tmp_path / f"twice.{form}.jsonl"
        run_verification(local, twice, out, target_k=3, query_form=form, progress=False)
        assert [r["pos_meta"]["id"] for r in read_jsonl(out)] == ["p03"]
        assert read_status(str(out) + ".status.jsonl")["q1"]["status"] == "duplicate"
    # a file is resumed only with the form it was made with
    with pytest.raises(DataError, match=rf"{title_out}:1: field 'query_form': this file was made with --query_form "
                                        r"title, not generated"):
        run_verification(local, GENERATED, title_out, target_k=3, query_form="generated", resume=True,
                         progress=False)
    cli_out = tmp_path / "cli.jsonl"
    assert verification_main("local_corpus", _local_args(tmp_path, cli_out, "--query_form", "generated")) == 0
    assert cli_out.read_bytes() == gen_out.read_bytes()


# ---------------------------------------------------------------------------------------------- 06 all failed
def test_06_exits_nonzero_when_every_item_failed(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("S2_API_KEY", raising=False)
    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps(r) + "\n" for r in read_jsonl(GENERATED)[:3]))
    healthy = {"on": False}
    answer = s2_route([s2_paper(i, r["title"], r["abstract"] or None) for i, r in enumerate(CORPUS.values())])

    def route(req):
        return answer(req) if healthy["on"] else Reply(503, {"message": "Service Unavailable"})

    out = tmp_path / "s2.jsonl"
    with FakeServer(route) as srv:
        args = ["--generated_jsonl", str(gen), "--out_jsonl", str(out), "--api_url", srv.url + "/graph/v1",
                "--rate", "0", "--max_retries", "0", "--cache_dir", "none", "--no_progress"]
        with pytest.raises(SystemExit) as exc:
            verification_main("semantic_scholar", args)
        assert exc.value.code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert re.fullmatch(r"error: all 3 items failed \(last error: semantic_scholar: HTTP 503.*\); rerun with "
                            r"--resume", err[-1]), err[-1]
        healthy["on"] = True  # the source is back: the resume retries them all and succeeds
        assert verification_main("semantic_scholar", [*args, "--resume"]) == 0
    assert {s["status"] for s in read_status(str(out) + ".status.jsonl").values()} <= {"ok", "duplicate", "no_hits"}
    assert read_jsonl(out)  # tuples written by the resumed run
    # only a run where nothing succeeded is an error; all refused (a 4xx) is one too, but --resume cannot help it
    assert VerificationStats(counts=Counter({"failed": 2, "no_hits": 1})).all_failed() is None
    assert VerificationStats().all_failed() is None  # nothing processed (all done before): fine
    refused = VerificationStats(counts=Counter({"refused": 2}), last_error="HTTP 400\nbad query").all_failed()
    assert refused == ("all 2 items were refused by the source (a 4xx, not retried by --resume; last error: HTTP 400 "
                       "bad query); check the queries and the source flags")


# ---------------------------------------------------------------------------------------------- T0 style: pieces
def test_query_style_and_cleaning_limits():
    assert [query_style(q) for q in ("Does X cause Y?", "X causes Y.", "graphene mobility",
                                     "Electron mobility of monolayer graphene under pressure")] == \
        ["question", "claim", "keywords", "title"]
    assert t0_query_style([c for c, _ in CLAIMS]) == "claim"
    assert t0_query_style(["What is X?", "A title of a paper here", "Why does Y fail?"]) == "question"
    assert t0_max_words([c for c, _ in CLAIMS]) == 18  # 2 x the 90th-percentile length (9 words of 7-10)
    long_claim = ("Hall measurements show that carrier mobility in monolayer graphene compressed inside a diamond "
                  "anvil cell falls by forty percent at five gigapascals while the hexagonal lattice stays intact.")
    assert clean_query(long_claim, max_words=12) == (None, "too_long")
    assert clean_query(long_claim)[1] == "ok"  # 05's cleaning (no limit) is unchanged
    abstract = CORPUS["p01"]["abstract"]  # Hall measurements of monolayer graphene ...
    assert shared_content_words("Graphene mobility drops under pressure in Hall measurements.", abstract) == 4
    assert shared_content_words("Dragons guard ancient castles.", abstract) == 0


@pytest.fixture()
def claims_t0(tmp_path) -> Path:
    path = tmp_path / "seed_claims.jsonl"
    path.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in CLAIMS))
    return path


@pytest.fixture()
def expansion(tmp_path) -> Path:
    out = tmp_path / "expansion.jsonl"
    run_verification(LocalCorpus(PAPERS, index_dir=tmp_path / "idx"), GENERATED, out, target_k=3, progress=False)
    return out


def test_examples_are_drawn_from_t0_deterministically(claims_t0, expansion):
    seed_set = load_seed(claims_t0)
    venetoclax = next(r for r in read_jsonl(expansion) if r["pos_meta"]["id"] == "p03")
    picks = draw_t0_examples(seed_set, venetoclax["id"], 3, seed=7, exclude=venetoclax["d_pos"])
    assert picks == draw_t0_examples(seed_set, venetoclax["id"], 3, seed=7, exclude=venetoclax["d_pos"])
    assert len(set(picks)) == 3
    for seed in range(20):  # T0's own row for this abstract would hand the model the answer: never shown
        assert 5 not in draw_t0_examples(seed_set, venetoclax["id"], 3, seed=seed, exclude=venetoclax["d_pos"])
    draws = {tuple(draw_t0_examples(seed_set, venetoclax["id"], 3, seed=s, exclude=venetoclax["d_pos"]))
             for s in range(20)}
    assert len(draws) > 1  # the seed matters
    prompt = build_t0_style_prompt([CLAIMS[i] for i in picks], venetoclax["d_pos"], "claim")
    assert prompt == build_t0_style_prompt([CLAIMS[i] for i in picks], venetoclax["d_pos"], "claim")
    assert "a claim (one declarative sentence) that the passage supports" in prompt
    for i in picks:
        assert f"Passage: {CLAIMS[i][1]}\nQuery: {CLAIMS[i][0]}\n" in prompt
    assert prompt.endswith(f"Passage: {venetoclax['d_pos']}\nQuery:")
    clipped = build_t0_style_prompt([CLAIMS[0]], "word " * 500, "claim", max_passage_chars=100)
    assert len(clipped.split("Passage: ")[-1]) < 120


# ---------------------------------------------------------------------------------------------- T0 style: runs
@pytest.fixture(scope="module")
def tiny_causal(tmp_path_factory) -> Path:
    return build_tiny_causal(tmp_path_factory.mktemp("tiny_causal_t0"))


def _run_06c(args: list[str]) -> dict:
    spec = importlib.util.spec_from_file_location("t0_06c", ROOT / "expansion" / "06c_t0_style_queries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(args)


KEPT = ("id", "q_model", "concepts", "d_pos", "pos_meta", "pos_rank", "n_hits", "negative_candidates", "source",
        "pos_score")


def test_t0_rewrite_with_a_tiny_model_keeps_tuples_resumes_and_survives_a_kill(tiny_causal, claims_t0, expansion,
                                                                            tmp_path):
    seed_set = load_seed(claims_t0)
    generator = HFGenerator(str(tiny_causal), device="cpu", batch_size=4)
    sampling = {"max_new_tokens": 10}
    out = tmp_path / "rewritten.jsonl"
    stats = rewrite_t0_style(expansion, seed_set, generator, out, k=2, seed=5, chunk_size=4, sampling=sampling,
                             progress=False)
    rows, recs = read_jsonl(expansion), read_jsonl(out)
    assert stats.style == "claim" and stats.tuples == len(rows) == 13
    assert stats.rewritten + stats.kept_title == 13 and stats.dropped == 0
    assert stats.prompts == 13 + sum(stats.rejected.values()) - stats.kept_title  # a rejected answer is asked again
    assert [r["id"] for r in recs] == [r["id"] for r in rows]
    for row, rec in zip(rows, recs):
        assert {k: rec.get(k) for k in KEPT} == {k: row.get(k) for k in KEPT}
        assert rec["q_title"] == row["q_new"] == row["pos_meta"]["title"]
        trace = rec["t0_rewrite"]
        assert trace["examples"] == [str(i) for i in draw_t0_examples(seed_set, row["id"], 2, 5, row["d_pos"])]
        assert trace["k"] == 2 and trace["seed"] == 5 and trace["style"] == "claim"
        if trace["status"] == "rewritten":
            assert rec["query_form"] == "t0" and rec["q_new"] != row["q_new"] and len(trace["rejected"]) < 2
        else:
            assert trace["status"] == "kept_title" and rec["query_form"] == "title" and rec["q_new"] == row["q_new"]
            assert len(trace["rejected"]) == 2  # both attempts' cleaning verdicts
    # --resume: nothing left, nothing generated, same bytes
    before = out.read_bytes()
    again = rewrite_t0_style(expansion, seed_set, generator, out, k=2, seed=5, chunk_size=4, sampling=sampling,
                             resume=True, progress=False)
    assert again.prompts == 0 and again.skipped_done == 13 and out.read_bytes() == before
    with pytest.raises(FileExistsError):
        rewrite_t0_style(expansion, seed_set, generator, out, k=2, seed=5, chunk_size=4, progress=False)
    with pytest.raises(ValueError, match=r"rewritten\.jsonl:1: this file was written with seed=5, not 6"):
        rewrite_t0_style(expansion, seed_set, generator, out, k=2, seed=6, chunk_size=4, resume=True, progress=False)
    other = HFGenerator(str(tiny_causal) + "/", device="cpu", batch_size=4)  # issue 44: another generator's name
    with pytest.raises(ValueError, match=r"rewritten\.jsonl:1: this file was written with generator=\{'backend': "
                                         r"'hf', 'model': '[^']+'}, not \{'backend': 'hf', 'model': '[^']+/'}"):
        rewrite_t0_style(expansion, seed_set, other, out, k=2, seed=5, chunk_size=4, resume=True, progress=False)
    # a run killed after two lines (and half of a third) of chunk 0: the resume redoes chunk 0 whole, same bytes
    killed = tmp_path / "killed.jsonl"
    lines = before.decode().splitlines(keepends=True)
    killed.write_text("".join(lines[:2]) + lines[2][:40])
    status = Path(str(out) + ".status.jsonl").read_text().splitlines(keepends=True)
    Path(str(killed) + ".status.jsonl").write_text("".join(status[:2]))
    resumed = rewrite_t0_style(expansion, seed_set, generator, killed, k=2, seed=5, chunk_size=4, sampling=sampling,
                               resume=True, progress=False)
    assert resumed.skipped_done == 2 and killed.read_bytes() == before


def test_06c_script_with_a_server_rewrites_keeps_or_drops_failures(claims_t0, expansion, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    prompts: list[str] = []

    def reply(messages, seed):
        prompt = messages[-1]["content"]
        prompts.append(prompt)
        passage = prompt.rsplit("Passage: ", 1)[1]
        if "Venetoclax" in passage:  # copies an example's query: an echo, rejected on every attempt
            return "Query: " + prompt.split("\nQuery: ", 1)[1].split("\n", 1)[0]
        if "LiFePO4" in passage:  # a fluent claim about something else: off_passage, rejected on every attempt
            return "Query: Dragons guard ancient castles through elaborate rituals."
        words = [w for w in re.findall(r"[A-Za-z]{5,}", passage)][:3]
        return f"Claim follows.\nQuery: Experiments show {words[0]} alters {words[1]} through {words[2]}."

    rows = read_jsonl(expansion)
    with FakeServer(openai_route(reply, model="gen-model")) as llm:
        base = ["--input_jsonl", str(expansion), "--train_data", str(claims_t0), "--backend", "openai",
                "--openai_url", llm.url + "/v1", "--seed", "3", "--no_progress"]
        kept = _run_06c([*base, "--out_jsonl", str(tmp_path / "kept.jsonl")])
        dropped = _run_06c([*base, "--out_jsonl", str(tmp_path / "dropped.jsonl"), "--on_failure", "drop"])
        n_asked = len(llm.paths("/v1/chat/completions"))
        again = _run_06c([*base, "--out_jsonl", str(tmp_path / "dropped.jsonl"), "--on_failure", "drop", "--resume"])
        assert len(llm.paths("/v1/chat/completions")) == n_asked == 30  # 13 + 2 retries, twice; none on resume
        assert again["prompts"] == 0 and again["skipped_done"] == 13
    venetoclax = next(r["id"] for r in rows if r["pos_meta"]["id"] == "p03")
    lifepo4 = next(r["id"] for r in rows if r["pos_meta"]["id"] == "p25")
    assert kept["style"] == "claim" and kept["generator"]["model"] == "gen-model"
    assert (kept["rewritten"], kept["kept_title"], kept["dropped"]) == (11, 2, 0)
    assert (dropped["rewritten"], dropped["kept_title"], dropped["dropped"]) == (11, 0, 2)
    assert kept["rejected"] == {"echo": 2, "off_passage": 2} and kept["prompts"] == 15
    recs = {r["id"]: r for r in read_jsonl(tmp_path / "kept.jsonl")}
    for row in rows:
        rec = recs[row["id"]]
        assert rec["d_pos"] == row["d_pos"] and rec["negative_candidates"] == row["negative_candidates"]
        if row["id"] in (venetoclax, lifepo4):
            assert rec["q_new"] == row["q_new"] and rec["query_form"] == "title"
            assert rec["t0_rewrite"]["rejected"] == (["echo"] * 2 if row["id"] == venetoclax else ["off_passage"] * 2)
        else:
            words = re.findall(r"[A-Za-z]{5,}", row["d_pos"])[:3]
            assert rec["q_new"] == f"Experiments show {words[0]} alters {words[1]} through {words[2]}."
            assert rec["query_form"] == "t0" and rec["q_title"] == row["q_new"]
    assert {venetoclax, lifepo4}.isdisjoint(r["id"] for r in read_jsonl(tmp_path / "dropped.jsonl"))
    status = {}
    for rec in read_jsonl(str(tmp_path / "dropped.jsonl") + ".status.jsonl"):
        status[rec["id"]] = rec["t0_rewrite"]["status"]
    assert status[venetoclax] == status[lifepo4] == "dropped" and list(status.values()).count("rewritten") == 11
    # every prompt shows T0 examples (claim -> abstract) and ends with the verified abstract
    by_abstract = {r["d_pos"]: r for r in rows}
    for prompt in prompts:
        assert prompt.count("\nQuery: ") == 3 and "a claim (one declarative sentence)" in prompt
        assert any(f"Query: {claim}\n" in prompt for claim, _ in CLAIMS)
        assert prompt.rsplit("Passage: ", 1)[1].removesuffix("\nQuery:") in by_abstract
