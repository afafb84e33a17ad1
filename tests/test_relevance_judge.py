"""Step 06d, the relevance judge (issue 30): P(yes) read from a real (tiny, random-weight) decoder's logits equals
the softmax computed here from the model's own forward pass; the positive is re-picked, tuples below the threshold
dropped, hits judged relevant never reach Stage III's candidates; a killed run resumes from the cache without
recomputing; an OpenAI-compatible server's logprobs (or only its text) are read; bad input is one line, exit 2;
the driver's rounds run 06d after each 06 and count its tuples."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repair.data import read_jsonl, write_jsonl
from repair.expansion.generation import HFGenerator, OpenAIGenerator
from repair.expansion.relevance_judge import (NO_WORDS, YES_WORDS, JudgeCache, RelevanceJudge, build_judge_prompt,
                                    judge_expansion, judge_tuple)
from repair.differentiation.tuples import load_tuples
from tests.helpers_generation import build_tiny_causal
from tests.helpers_sources import FakeServer, Reply

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
PAPERS = {r["id"]: r for r in read_jsonl(Path(__file__).parent / "fixtures" / "expansion" / "papers.jsonl")}
SCRIPT = ROOT / "expansion" / "06d_judge_relevance.py"


def _hit(pid: str) -> dict:
    p = PAPERS[pid]
    return {"id": pid, "doi": None, "title": p["title"], "abstract": p["abstract"]}


def _tuple(i: int, query: str, pos: str, cands: list[str], form: str | None = None) -> dict:
    rec = {"id": f"r1-{i}", "q_model": query, "concepts": [], "q_new": PAPERS[pos]["title"] if form is None else query,
           "d_pos": PAPERS[pos]["abstract"], "pos_meta": {"id": pos, "doi": None, "title": PAPERS[pos]["title"],
                                                         "year": 2020, "venue": "J", "url": None},
           "pos_rank": 1, "n_hits": 1 + len(cands), "negative_candidates": [_hit(c) for c in cands],
           "source": "local_corpus", "pos_score": 3.5}
    if form is not None:
        rec["query_form"] = form
    return rec


@pytest.fixture
def expansion(tmp_path) -> Path:
    rows = [_tuple(0, "How does pressure change graphene mobility?", "p01", ["p02", "p03", "p04"]),
            _tuple(1, "Which drug inhibits BCL-2 in leukemia?", "p03", ["p01", "p05", "p09"], form="generated"),
            _tuple(2, "Does titanium doping help hematite photoanodes?", "p05", ["p04", "p02"]),
            _tuple(3, "Is fatigue of printed lattices set by roughness?", "p02", ["p09", "p01", "p03"]),
            _tuple(4, "APOE4 and amyloid clearance", "p09", ["p03", "p05"], form="generated")]
    path = tmp_path / "expansion.jsonl"
    write_jsonl(path, rows)
    return path


@pytest.fixture(scope="module")
def tiny_causal(tmp_path_factory) -> Path:
    return build_tiny_causal(tmp_path_factory.mktemp("tiny_judge"), seed=3)


def _p_yes_by_hand(folder: Path, prompts: list[str]) -> list[float]:
    """P(yes) computed from scratch: the model's full forward on each unpadded chat-templated prompt, the softmax of
    its last-position logits over the single-token spellings of yes / no."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    spell = lambda words: list(dict.fromkeys(t[0] for t in (tok.encode(w, add_special_tokens=False) for w in words)
                                             if len(t) == 1))
    yes, no = spell(["yes", "Yes", "YES", " yes", " Yes", " YES"]), spell(["no", "No", "NO", " no", " No", " NO"])
    assert yes and no
    out = []
    for prompt in prompts:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        z = torch.exp(logits[yes + no] - logits[yes + no].max())
        out.append(float(z[:len(yes)].sum() / z.sum()))
    return out


def test_yes_probability_is_the_softmax_of_the_models_yes_no_logits(tiny_causal, tmp_path):
    assert YES_WORDS == ("yes", "Yes", "YES", " yes", " Yes", " YES") and NO_WORDS[0] == "no"
    generator = HFGenerator(str(tiny_causal), device="cpu", batch_size=2)
    pairs = [("graphene mobility under pressure", PAPERS["p01"]["title"], PAPERS["p01"]["abstract"]),
             ("BCL-2", "", PAPERS["p03"]["abstract"]),  # short and long prompts share a padded batch
             ("Which drug inhibits BCL-2 in leukemic cells and spares platelets, and at what affinity?",
              PAPERS["p03"]["title"], PAPERS["p03"]["abstract"] * 8)]
    judge = RelevanceJudge(generator, JudgeCache(tmp_path / "cache.jsonl"), batch_size=2)
    got = [r["p_yes"] for r in judge.probabilities(pairs)]
    expected = _p_yes_by_hand(tiny_causal, [build_judge_prompt(q, t, a) for q, t, a in pairs])
    assert got == pytest.approx(expected, abs=2e-6)
    assert all(0 < p < 1 for p in got) and len({round(p, 4) for p in got}) == 3  # not a constant
    assert judge.computed == 3 and judge.sources == {"logits": 3}
    # the prompt cuts long abstracts (a small judge's context) and asks the yes/no question last
    prompt = build_judge_prompt(*pairs[2])
    abstract = prompt.split("Abstract: ", 1)[1].split("\n\n", 1)[0]
    assert prompt.endswith("Answer with one word: yes or no.") and abstract.endswith(" ...")
    assert 900 < len(abstract) <= 1004 and PAPERS["p03"]["abstract"].startswith(abstract[:150])


def test_judge_tuple_repicks_drops_and_keeps_relevant_hits_out_of_the_negatives(expansion, tmp_path):
    title_form, generated_form = read_jsonl(expansion)[0], read_jsonl(expansion)[1]
    out = judge_tuple(title_form, [0.2, 0.9, 0.7, 0.1], threshold=0.5, judge_k=4)
    assert out["d_pos"] == PAPERS["p02"]["abstract"] and out["q_new"] == PAPERS["p02"]["title"]
    assert out["pos_meta"] == {"id": "p02", "doi": None, "title": PAPERS["p02"]["title"]} and out["pos_p_yes"] == 0.9
    assert out["source_pos_meta"]["id"] == "p01" and "pos_rank" not in out and "pos_score" not in out
    assert [h["id"] for h in out["judged_relevant"]] == ["p03"] and out["judged_relevant"][0]["p_yes"] == 0.7
    assert [(h["id"], h.get("p_yes")) for h in out["negative_candidates"]] == [("p01", 0.2), ("p04", 0.1)]
    assert out["judge"] == {"prompt_id": "repair-judge-v1", "threshold": 0.5, "judge_k": 4, "judged": 4, "picked": 1}
    # generated form: q_new is the query itself and stays; unjudged candidates (beyond judge_k) stay negatives
    out = judge_tuple(generated_form, [0.4, 0.8], threshold=0.5, judge_k=2)
    assert out["q_new"] == generated_form["q_new"] and out["d_pos"] == PAPERS["p01"]["abstract"]
    assert [(h["id"], h.get("p_yes")) for h in out["negative_candidates"]] == [("p03", 0.4), ("p05", None),
                                                                               ("p09", None)]
    # the source's positive kept when the judge agrees; nothing at the threshold: dropped
    kept = judge_tuple(title_form, [0.8, 0.3, 0.8, 0.1], threshold=0.5, judge_k=4)
    assert kept["d_pos"] == title_form["d_pos"] and kept["judge"]["picked"] == 0 and kept["pos_rank"] == 1
    assert judge_tuple(title_form, [0.49, 0.3, 0.2, 0.1], threshold=0.5, judge_k=4) is None
    # what Stage III (07/08/09 read through repair.differentiation.tuples) sees: the relevant hit is no candidate of the tuple
    judged = tmp_path / "judged.jsonl"
    write_jsonl(judged, [judge_tuple(title_form, [0.2, 0.9, 0.7, 0.1], threshold=0.5, judge_k=4)])
    ts = load_tuples(judged)
    cands = {ts.documents.texts[r] for r in ts.candidates(0)}
    assert ts.documents.texts[ts.pos_rows[0]] == PAPERS["p02"]["abstract"]
    assert cands == {PAPERS["p01"]["abstract"], PAPERS["p04"]["abstract"]}


def test_judged_file_follows_the_models_probabilities_and_resumes_after_a_kill(tiny_causal, expansion, tmp_path):
    generator = HFGenerator(str(tiny_causal), device="cpu", batch_size=2)
    # every P(yes) once, then a threshold between the tuples' best scores, so some tuples are kept and some dropped
    probe = judge_expansion(expansion, RelevanceJudge(generator, JudgeCache(tmp_path / "c0.jsonl"), batch_size=2),
                            tmp_path / "probe.jsonl", threshold=0.0, judge_k=3, progress=False)
    assert probe.kept == 5 and probe.computed == probe.judged_pairs == 15
    probs = {r["id"]: r["p_yes"] for r in read_jsonl(str(tmp_path / "probe.jsonl") + ".status.jsonl")}
    best = sorted(max(p) for p in probs.values())
    threshold = (best[1] + best[2]) / 2

    reference = tmp_path / "reference.jsonl"
    stats = judge_expansion(expansion, RelevanceJudge(generator, JudgeCache(tmp_path / "c1.jsonl"), batch_size=2),
                            reference, threshold=threshold, judge_k=3, chunk=2, progress=False)
    assert (stats.kept, stats.dropped) == (3, 2)
    rows = {r["id"]: r for r in read_jsonl(expansion)}
    for rec in read_jsonl(reference):
        p = probs[rec["id"]]
        hits = [rows[rec["id"]]["d_pos"]] + [c["abstract"] for c in rows[rec["id"]]["negative_candidates"]]
        assert rec["d_pos"] == hits[p.index(max(p))] and rec["pos_p_yes"] == pytest.approx(max(p), abs=1e-6)
        relevant = {hits[i] for i in range(3) if p[i] >= threshold} - {rec["d_pos"]}
        assert {h["abstract"] for h in rec["judged_relevant"]} == relevant
        assert relevant.isdisjoint(c["abstract"] for c in rec["negative_candidates"])
        assert len(rec["negative_candidates"]) + len(relevant) == len(hits) - 1
    assert stats.repicked == sum(p.index(max(p)) > 0 for i, p in probs.items() if max(p) >= threshold)

    # killed during the third forward pass: what the first two computed is in the cache, nothing is written
    calls = {"n": 0}
    forward = generator.model.forward

    def counting_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3 and calls.get("kill"):
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    generator.model.forward = counting_forward
    out, cache = tmp_path / "judged.jsonl", tmp_path / "cache.jsonl"
    calls["kill"] = True
    with pytest.raises(KeyboardInterrupt):
        judge_expansion(expansion, RelevanceJudge(generator, JudgeCache(cache), batch_size=2), out,
                        threshold=threshold, judge_k=3, chunk=2, progress=False)
    assert not out.exists() and len(read_jsonl(cache)) == 4
    calls.update(n=0, kill=False)
    resumed = judge_expansion(expansion, RelevanceJudge(generator, JudgeCache(cache), batch_size=2), out,
                              threshold=threshold, judge_k=3, chunk=2, progress=False)
    # the rest: 2 prompts of chunk 1, 6 of chunk 2, 3 of chunk 3, in batches of 2 (chunk by chunk)
    assert (resumed.reused, resumed.computed) == (4, 11) and calls["n"] == 6
    assert _same_judged(read_jsonl(out), read_jsonl(reference))
    calls["n"] = 0
    again = judge_expansion(expansion, RelevanceJudge(generator, JudgeCache(cache), batch_size=2), out,
                            threshold=threshold, judge_k=3, chunk=2, progress=False)
    assert (again.reused, again.computed, calls["n"]) == (15, 0, 0) and _same_judged(read_jsonl(out),
                                                                                      read_jsonl(reference))
    generator.model.forward = forward


def _same_judged(a: list[dict], b: list[dict]) -> bool:
    """Same tuples, positives and candidates; probabilities equal to 1e-5 (a batch of other prompts pads
    differently, which moves the last digits)."""
    strip = lambda r: {k: v for k, v in r.items() if k not in ("pos_p_yes", "judged_relevant", "negative_candidates")}
    texts = lambda hits: [h["abstract"] for h in hits]
    return len(a) == len(b) and all(
        strip(x) == strip(y) and abs(x["pos_p_yes"] - y["pos_p_yes"]) < 1e-5
        and texts(x["judged_relevant"]) == texts(y["judged_relevant"])
        and texts(x["negative_candidates"]) == texts(y["negative_candidates"]) for x, y in zip(a, b))


def _judge_route(answers: dict[str, tuple[float, float] | str], seen: list[dict]):
    """``POST /v1/chat/completions`` of a judge server: for a document whose title contains a key, the top
    logprobs of "Yes" / "No" given (in probabilities), or (a string) only that text, without logprobs."""
    def route(req) -> Reply:
        body = req.json
        seen.append(body)
        prompt = body["messages"][-1]["content"]
        title = prompt.split("Title: ", 1)[1].split("\n", 1)[0]
        key = next(k for k in answers if k in title)
        answer = answers[key]
        choice = {"index": 0, "message": {"role": "assistant", "content": answer if isinstance(answer, str) else
                                          ("Yes" if answer[0] > answer[1] else "No")}, "finish_reason": "length"}
        if not isinstance(answer, str):
            top = [{"token": "Yes", "logprob": math.log(answer[0])}, {"token": "No", "logprob": math.log(answer[1])},
                   {"token": "Maybe", "logprob": math.log(0.01)}]
            choice["logprobs"] = {"content": [{"token": top[0]["token"], "logprob": top[0]["logprob"],
                                               "top_logprobs": top}]}
        return Reply(200, {"id": "c", "object": "chat.completion", "model": body["model"], "choices": [choice]})
    return route


def test_openai_judge_reads_logprobs_or_falls_back_to_the_text(expansion, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    seen: list[dict] = []
    answers = {"graphene": (0.6, 0.2), "Venetoclax": (0.1, 0.8), "Ti6Al4V": "yes, it is", "hematite": "No.",
               "APOE4": (0.3, 0.3)}
    with FakeServer(_judge_route(answers, seen)) as srv:
        generator = OpenAIGenerator(base_url=srv.url + "/v1", model="judge-model", concurrency=2)
        judge = RelevanceJudge(generator, JudgeCache(tmp_path / "cache.jsonl"))
        pairs = [("q", PAPERS[p]["title"], PAPERS[p]["abstract"]) for p in ("p01", "p03", "p02", "p05", "p09")]
        recs = judge.probabilities(pairs)
    assert [r["p_yes"] for r in recs] == [0.75, pytest.approx(0.111111), 1.0, 0.0, 0.5]
    assert [r["from"] for r in recs] == ["logprobs", "logprobs", "text", "text", "logprobs"]
    assert judge.sources == {"logprobs": 3, "text": 2}
    assert all(b["max_tokens"] == 1 and b["logprobs"] is True and b["top_logprobs"] == 20 and b["temperature"] == 0
               for b in seen)


def _run_06d(args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_06d_script_names_the_bad_line_and_field(expansion, tmp_path):
    rows = read_jsonl(expansion)
    bad = tmp_path / "bad.jsonl"
    broken = dict(rows[1])
    del broken["d_pos"]
    write_jsonl(bad, [rows[0], broken])
    res = _run_06d(["--input_jsonl", str(bad), "--out_jsonl", str(tmp_path / "o.jsonl"), "--model", "/nonexistent"])
    assert res.returncode == 2 and res.stderr.strip() == f"error: {bad}:2: missing field 'd_pos'"
    nested = dict(rows[2], negative_candidates=[{"id": "x", "abstract": None}])
    write_jsonl(bad, [nested])
    res = _run_06d(["--input_jsonl", str(bad), "--out_jsonl", str(tmp_path / "o.jsonl")])
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: {bad}:1: field 'negative_candidates[0].abstract' must be a string"
    assert not (tmp_path / "o.jsonl").exists()


def test_06d_script_with_a_server_and_the_rounds_wiring(expansion, tmp_path):
    seen: list[dict] = []
    answers = {"graphene": (0.9, 0.1), "Venetoclax": (0.2, 0.7), "Ti6Al4V": (0.6, 0.4), "hematite": (0.1, 0.9),
               "APOE4": (0.05, 0.9), "Cyclin": (0.1, 0.9)}
    with FakeServer(_judge_route(answers, seen)) as srv:
        flags = ["--input_jsonl", str(expansion), "--out_jsonl", str(tmp_path / "judged.jsonl"), "--backend", "openai",
                 "--openai_url", srv.url + "/v1", "--model", "judge-model", "--threshold", "0.55", "--judge_k", "3",
                 "--no_progress"]
        first = _run_06d(flags)
        assert first.returncode == 0, first.stderr[-2000:]
        n = len(seen)
        second = _run_06d(flags)
        assert second.returncode == 0 and len(seen) == n  # every judgment from the cache
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    again = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["judge"]["model"] == "judge-model" and summary["p_yes_from"] == {"logprobs": 15}
    assert (again["computed"], again["reused_from_cache"]) == (0, 15)
    assert (tmp_path / "judged.jsonl.cache.jsonl").exists()
    judged = {r["id"]: r for r in read_jsonl(tmp_path / "judged.jsonl")}
    # r1-1 (Venetoclax positive, 0.22) is re-picked to p01 (graphene, 0.9); r1-2 (hematite 0.1, Cyclin 0.1, Ti6Al4V
    # 0.6): positive p02; r1-4 (APOE4 0.05, Venetoclax 0.22, hematite 0.1): dropped
    assert sorted(judged) == ["r1-0", "r1-1", "r1-2", "r1-3"] and summary["dropped"] == 1
    assert judged["r1-1"]["d_pos"] == PAPERS["p01"]["abstract"] and judged["r1-1"]["q_new"].startswith("Which drug")
    assert judged["r1-2"]["pos_meta"]["id"] == "p02" and judged["r1-2"]["q_new"] == PAPERS["p02"]["title"]
    # r1-3: p02 positive (0.6) and p01 graphene (0.9) judged; graphene is the positive, p02 relevant, not a negative
    assert judged["r1-3"]["pos_meta"]["id"] == "p01"
    assert [h["id"] for h in judged["r1-3"]["judged_relevant"]] == ["p02"]
    assert "p02" not in [c["id"] for c in judged["r1-3"]["negative_candidates"]]

    # the driver's rounds: 06d after 06 with the driver's flags, on 06's file, and the judged file is what counts
    from repair.driver.expansion_rounds import ExpansionRounds

    stage = ExpansionRounds(iteration="iter1", concept_txt=Path("c.txt"), generated_jsonl=tmp_path / "g.jsonl",
                            out_jsonl=expansion, gen_round=8, max_rounds=2, target_valid=10, target_k=3, seed=1,
                            grounding="none", query_form="title", source="local", local_corpus="corpus",
                            judged_jsonl=tmp_path / "judged.jsonl",
                            judge_args="--backend hf --model qwen2.5-coder-0.5b --threshold 0.55 --cache_jsonl 'a b'")
    cmd = stage.judge_command("py", ROOT / "expansion")
    assert cmd == ["py", str(ROOT / "expansion" / "06d_judge_relevance.py"), "--input_jsonl", str(expansion),
                   "--out_jsonl", str(tmp_path / "judged.jsonl"), "--backend", "hf", "--model", "qwen2.5-coder-0.5b",
                   "--threshold", "0.55", "--cache_jsonl", "a b"]
    assert stage.counted_jsonl() == tmp_path / "judged.jsonl"
    assert tmp_path / "judged.jsonl" in stage.outputs()


def test_judge_settings_are_checked_up_front(tmp_path):
    from repair.driver.settings import resolve, validate

    env = {"TRAIN_DATA": str(ROOT / "data" / "demo" / "scifact-demo"), "JUDGE": "1", "JUDGE_THRESHOLD": "1.5",
           "JUDGE_K": "0", "EXPANSION": "0", "CONFUSED_TUPLES": "1", "OUT_DIR": str(tmp_path)}
    problems = validate(resolve(env, ROOT), env)
    assert "JUDGE_THRESHOLD must be in [0, 1], got 1.5" in problems
    assert "JUDGE_K must be in 1..2147483647, got 0" in problems
    assert "JUDGE=1 judges Stage II's verified tuples: it needs EXPANSION=1" in problems
    ok = {**env, "JUDGE_THRESHOLD": "0.6", "JUDGE_K": "4", "EXPANSION": "1"}
    resolved = resolve(ok, ROOT)
    assert not [p for p in validate(resolved, ok, check_installed=False) if "JUDGE" in p]
    assert resolved.values["JUDGE_MODEL"] == "qwen2.5-coder-0.5b"
    assert resolve({k: v for k, v in ok.items() if k != "JUDGE"}, ROOT).values["JUDGE"] == "0"  # opt-in


def test_rounds_run_06d_after_06_and_count_the_judged_tuples(tmp_path):
    """expansion/05_06_rounds.py --judge 1 as run_repair.sh calls it: 05 (a generator server), 06 (BM25 over the
    fixture papers), 06d (a judge server with logprobs) as driver steps; the judged file is what is counted."""
    import re

    fix = Path(__file__).parent / "fixtures" / "expansion"

    def route(req) -> Reply:
        body = req.json
        if req.path == "/v1/models":
            return Reply(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        prompt = body["messages"][-1]["content"]
        if body.get("logprobs"):  # the judge: yes for papers whose title's word count is a multiple of 3
            title = prompt.split("Title: ", 1)[1].split("\n", 1)[0]
            p = 0.8 if len(title.split()) % 3 == 0 else 0.3
            top = [{"token": "yes", "logprob": math.log(p)}, {"token": "no", "logprob": math.log(1 - p)}]
            choice = {"index": 0, "message": {"role": "assistant", "content": "yes" if p > 0.5 else "no"},
                      "logprobs": {"content": [{**top[0], "top_logprobs": top}]}}
            return Reply(200, {"choices": [choice]})
        concepts = re.findall(r"Concept \d+: (.+?) \(Attributes", prompt) or ["materials"]
        angles = ["electron mobility", "fatigue strength", "band gap", "drug resistance", "crystal structure"]
        n, seed = int(body.get("n", 1)), body.get("seed", 0)
        return Reply(200, {"choices": [{"index": i, "message": {"role": "assistant", "content":
                           f"How does the {angles[(seed + i) % 5]} of {' and '.join(concepts)} change under pressure?"}}
                                       for i in range(n)]})

    run = tmp_path / "run"
    exp = run / "iter1" / "expansion"
    exp.mkdir(parents=True)
    with FakeServer(route) as srv:
        backend = f"--backend openai --openai_url {srv.url}/v1 --model m"
        cmd = [sys.executable, str(ROOT / "expansion" / "05_06_rounds.py"), "--iteration", "iter1",
               "--state_dir", str(run / "state"), "--logs_dir", str(run / "logs"), "--concept_txt",
               str(fix / "concepts.txt"), "--generated_jsonl", str(exp / "generated.jsonl"), "--out_jsonl",
               str(exp / "expansion.jsonl"), "--gen_round", "8", "--max_rounds", "1", "--target_valid", "100",
               "--target_k", "3", "--seed", "7", "--source", "local", "--local_corpus", str(fix / "papers.jsonl"),
               "--judge", "1", "--judged_jsonl", str(exp / "judged.jsonl"), "--judge_args",
               f"{backend} --threshold 0.5 --judge_k 3 --cache_jsonl {run / 'cache' / 'judge.jsonl'}",
               "--", "--backend", "openai", "--openai_url", srv.url + "/v1"]
        for folder in ("state", "logs"):
            (run / folder).mkdir()
        env = dict(os.environ, REPAIR_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        env.pop("OPENAI_API_KEY", None)
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    verified, judged = read_jsonl(exp / "expansion.jsonl"), read_jsonl(exp / "judged.jsonl")
    judged_yes = lambda hit: len(hit["title"].split()) % 3 == 0  # what the judge server says yes to
    expected = [r["id"] for r in verified if any(judged_yes(h) for h in [r["pos_meta"], *r["negative_candidates"]][:3])]
    assert [r["id"] for r in judged] == expected and 0 < len(judged) < len(verified)
    assert all(judged_yes(r["pos_meta"]) and r["pos_p_yes"] == 0.8 for r in judged)
    assert f"expansion round 1: {len(judged)} / 100 valid tuples" in res.stdout
    assert (run / "state" / "iter1.expansion.done").read_text() == f"{len(judged)}\n"
    assert (run / "state" / "iter1.06d_judge.r1.done").exists()
    judge_cmd = (run / "logs" / "iter1.06d_judge.r1.cmd").read_text()
    assert f"06d_judge_relevance.py --input_jsonl {exp / 'expansion.jsonl'} --out_jsonl {exp / 'judged.jsonl'}" \
        in judge_cmd and "--threshold 0.5 --judge_k 3" in judge_cmd
    assert len(read_jsonl(run / "cache" / "judge.jsonl")) == sum(min(3, 1 + len(r["negative_candidates"]))
                                                                  for r in verified)
