"""Stage II's rounds as the driver runs them (expansion/05_06_rounds.py, once the bash loop of run_repair.sh):
05 -> 06 rounds with the driver's step markers, .cmd files, logs and console lines; the round and round-limit
lines; the stage marker holding the valid count; a rerun that skips, a failed step that a rerun resumes, FORCE=1,
EXPANSION=0, QUERY_FORM=generated, and the flags each SOURCE gets. 05's generator is an OpenAI-compatible server
on 127.0.0.1 and 06 searches the fixture papers with BM25 (real subprocesses, real files)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repair.data import read_jsonl
from repair.driver.expansion_rounds import ExpansionRounds
from repair.expansion.verification import count_valid
from tests.helpers_sources import FakeServer, openai_route

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "expansion" / "05_06_rounds.py"
FIX = Path(__file__).parent / "fixtures" / "expansion"
PAPERS, CONCEPTS = FIX / "papers.jsonl", FIX / "concepts.txt"
ANGLES = ["electron mobility", "fatigue strength", "band gap", "drug resistance", "crystal structure"]


def reply_for(messages: list[dict], seed: int) -> str:
    """A query about the concepts the REPAIR prompt lists, one angle per seed (so rounds add new queries)."""
    concepts = re.findall(r"Concept \d+: (.+?) \(Attributes", messages[-1]["content"]) or ["materials"]
    return f"How does the {ANGLES[seed % len(ANGLES)]} of {' and '.join(concepts)} change under pressure?"


@pytest.fixture(scope="module")
def server():
    with FakeServer(openai_route(reply_for, model="fake-generator")) as srv:
        yield srv


def run_rounds(run: Path, server_url: str, *extra: str, corpus: Path = PAPERS) -> subprocess.CompletedProcess:
    exp = run / "iter1" / "expansion"
    exp.mkdir(parents=True, exist_ok=True)
    for folder in ("state", "logs"):
        (run / folder).mkdir(exist_ok=True)
    cmd = [sys.executable, str(SCRIPT), "--iteration", "iter1", "--state_dir", str(run / "state"),
           "--logs_dir", str(run / "logs"), "--concept_txt", str(CONCEPTS),
           "--generated_jsonl", str(exp / "generated.jsonl"), "--out_jsonl", str(exp / "expansion.jsonl"),
           "--gen_round", "8", "--max_rounds", "2", "--target_valid", "100", "--target_k", "3", "--seed", "7",
           "--source", "local", "--local_corpus", str(corpus), *extra,
           "--", "--backend", "openai", "--openai_url", server_url + "/v1"]
    env = dict(os.environ, REPAIR_CACHE=str(run.parent / "cache"), OMP_NUM_THREADS="1")
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def said(stdout: str) -> list[str]:
    """The driver's console lines without their time stamps."""
    return [re.sub(r"^\[repair \d\d:\d\d:\d\d\] ", "", ln) for ln in stdout.splitlines() if ln.startswith("[repair ")]


def files(run: Path) -> dict[str, bytes]:
    exp = run / "iter1" / "expansion"
    return {p.name: p.read_bytes() for p in sorted(exp.iterdir()) if not p.name.endswith(".status.jsonl")}


def test_rounds_until_the_limit_then_skip_resume_and_force(tmp_path, server):
    run = tmp_path / "run"
    first = run_rounds(run, server.url)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    lines = said(first.stdout)
    expansion = run / "iter1" / "expansion" / "expansion.jsonl"
    valid = count_valid(expansion)
    rounds = [ln for ln in lines if ln.startswith("expansion round")]
    assert len(rounds) == 2 and rounds[1] == f"expansion round 2: {valid} / 100 valid tuples"
    assert 0 < int(rounds[0].split()[3]) <= valid
    assert lines[-2:] == [f"expansion stopped at the round limit (2): {valid} / 100 valid tuples; the run goes on with",
                          "  these (more: raise MAX_ROUNDS or GEN_ROUND, or use a stronger generator; see "
                          "docs/expansion.md)"]
    steps = ["iter1.05_generate.r1", "iter1.06_verify.r1", "iter1.05_generate.r2", "iter1.06_verify.r2"]
    assert [ln.split()[1] for ln in lines if ln.startswith("start ")] == steps
    assert f"start iter1.05_generate.r1  (log: {run / 'logs' / 'iter1.05_generate.r1.log'})" in lines
    # the console shows each stage's JSON summary as a short line; the log keeps the JSON
    assert "  summary (iter1.06_verify.r2): source=local_corpus mode=query " in first.stdout
    assert not [ln for ln in first.stdout.splitlines() if ln.startswith("{")]
    summary = json.loads((run / "logs" / "iter1.06_verify.r2.log").read_text().splitlines()[-1])
    # round 2's 06 verified the 8 queries round 2's 05 added (05's rounds are 8 queries), and only those
    assert summary["valid_total"] == valid and sum(summary["processed"].values()) == 8 and summary["skipped_done"] == 8
    # the stage marker holds the valid count; every step has its marker (seconds) and its command
    assert (run / "state" / "iter1.expansion.done").read_text() == f"{valid}\n"
    assert all(re.fullmatch(r"\d+\n", (run / "state" / f"{s}.done").read_text()) for s in steps)
    cmds = {s: (run / "logs" / f"{s}.cmd").read_text() for s in steps}
    assert cmds["iter1.05_generate.r1"].startswith(f"{sys.executable} {ROOT / 'expansion' / '05_query_generation.py'} ")
    assert "--num_queries 8 " in cmds["iter1.05_generate.r1"] and "--resume" not in cmds["iter1.05_generate.r1"]
    assert "--num_queries 16 " in cmds["iter1.05_generate.r2"] and "--resume" in cmds["iter1.05_generate.r2"]
    assert f"--backend openai --openai_url {server.url}/v1 " in cmds["iter1.05_generate.r1"]
    assert cmds["iter1.06_verify.r1"].endswith(" --target_k 3 --target_valid 100 \n")
    assert cmds["iter1.06_verify.r2"].endswith(" --target_valid 100 --resume \n")
    assert f"06_local_corpus.py --corpus {PAPERS} --generated_jsonl " in cmds["iter1.06_verify.r1"]
    assert "--query_form" not in cmds["iter1.06_verify.r1"]
    assert [r["round"] for r in read_jsonl(run / "iter1" / "expansion" / "generated.jsonl.rounds.jsonl")] == [0, 1]
    before = files(run)

    # a rerun of a finished stage only says so
    again = run_rounds(run, server.url)
    assert again.returncode == 0 and said(again.stdout) == [f"skip  iter1.expansion (done: {valid} valid tuples)"]
    assert files(run) == before

    # a run killed in round 2's 06 left no marker for it (nor for the stage): the rerun resumes exactly there
    for marker in ("iter1.06_verify.r2.done", "iter1.expansion.done"):
        (run / "state" / marker).unlink()
    resumed = run_rounds(run, server.url)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [ln for ln in said(resumed.stdout) if ln.startswith(("skip", "start"))] == [
        "skip  iter1.05_generate.r1 (done)", "skip  iter1.06_verify.r1 (done)", "skip  iter1.05_generate.r2 (done)",
        f"start iter1.06_verify.r2  (log: {run / 'logs' / 'iter1.06_verify.r2.log'})"]
    assert files(run) == before and (run / "state" / "iter1.expansion.done").read_text() == f"{valid}\n"

    # FORCE=1 starts the stage over (its files removed, 05 without --resume) and writes the same bytes
    forced = run_rounds(run, server.url, "--force", "1")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert [ln.split()[1] for ln in said(forced.stdout) if ln.startswith("start ")] == steps
    assert "--resume" not in (run / "logs" / "iter1.05_generate.r1.cmd").read_text()
    assert files(run) == before


def test_failed_step_stops_and_a_rerun_resumes_it_with_query_form_generated(tmp_path, server):
    run = tmp_path / "run"
    failed = run_rounds(run, server.url, "--query_form", "generated", "--target_valid", "2",
                        corpus=tmp_path / "missing_corpus.jsonl")
    assert failed.returncode == 1
    lines = said(failed.stdout)
    cmd = (run / "logs" / "iter1.06_verify.r1.cmd").read_text()
    assert lines[-4:] == ["FAILED step 'iter1.06_verify.r1'", f"  log:   {run / 'logs' / 'iter1.06_verify.r1.log'}",
                          f"  rerun: {cmd.rstrip(chr(10))}",
                          "  (or rerun the driver: finished steps are skipped, this one resumes)"]
    assert "missing_corpus.jsonl" in (run / "logs" / "iter1.06_verify.r1.log").read_text()
    assert (run / "state" / "iter1.05_generate.r1.done").exists()
    assert not (run / "state" / "iter1.06_verify.r1.done").exists() and not (run / "state" / "iter1.expansion.done").exists()

    fixed = run_rounds(run, server.url, "--query_form", "generated", "--target_valid", "2")
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    lines = said(fixed.stdout)
    assert lines[0] == "skip  iter1.05_generate.r1 (done)"
    valid = count_valid(run / "iter1" / "expansion" / "expansion.jsonl")
    assert valid >= 2 and lines[-1] == f"expansion round 1: {valid} / 2 valid tuples"  # target met: no round 2
    assert "--query_form generated" in (run / "logs" / "iter1.06_verify.r1.cmd").read_text()
    rows = read_jsonl(run / "iter1" / "expansion" / "expansion.jsonl")
    assert rows and all(r["q_new"] == r["q_model"] and r["query_form"] == "generated" for r in rows)


def test_expansion_0_skips_the_stage(tmp_path, server):
    asked = len(server.requests)
    proc = run_rounds(tmp_path / "run", server.url, "--expansion", "0")
    assert proc.returncode == 0 and said(proc.stdout) == ["skip  iter1.expansion (EXPANSION=0)"]
    assert list((tmp_path / "run" / "iter1" / "expansion").iterdir()) == []
    assert list((tmp_path / "run" / "state").iterdir()) == [] and len(server.requests) == asked


def stage(tmp_path: Path, **kw) -> ExpansionRounds:
    base = dict(iteration="iter2", concept_txt=tmp_path / "c.txt", generated_jsonl=tmp_path / "g.jsonl",
                out_jsonl=tmp_path / "e.jsonl", gen_round=16, max_rounds=3, target_valid=24, target_k=20, seed=42,
                grounding="none", query_form="title", source="local", local_corpus="corpus")
    return ExpansionRounds(**{**base, **kw})


def test_each_source_gets_its_script_and_key_file(tmp_path):
    scripts = Path("/x/expansion")
    s2 = stage(tmp_path, source="semantic_scholar", s2_key_file="/keys/s2.txt", elsevier_key_file="/keys/els.txt")
    assert s2.verify_command("py", scripts)[:4] == ["py", "/x/expansion/06_semantic_scholar.py", "--key_file",
                                                    "/keys/s2.txt"]
    els = stage(tmp_path, source="elsevier")  # no key file: the script reads $ELSEVIER_API_KEY
    assert els.verify_command("py", scripts)[:3] == ["py", "/x/expansion/06_elsevier.py", "--generated_jsonl"]
    assert stage(tmp_path, query_form="t0").verify_command("py", scripts)[-2:] == ["--target_valid", "24"]
    gen = stage(tmp_path, generator_flags=["--backend", "hf", "--model", "m", "--adapter", "a"], device="cuda:1")
    assert gen.generate_command("py", scripts, 3)[6:] == ["--num_queries", "48", "--seed", "42", "--grounding", "none",
                                                         "--backend", "hf", "--model", "m", "--adapter", "a",
                                                         "--device", "cuda:1"]
    (tmp_path / "g.jsonl").write_text("")
    assert gen.generate_command("py", scripts, 1)[-3:] == ["--resume", "--device", "cuda:1"]
    with pytest.raises(ValueError, match="SOURCE must be one of local, semantic_scholar, elsevier, got 'google'"):
        stage(tmp_path, source="google")


def test_hard_selection_each_round_until_the_hard_target(tmp_path, server, tiny_model_dir):
    """HARD_TUPLES=1 (issue 43): 06e runs after each round's 06 on the whole verified file and the rounds count its
    hard tuples against --hard_target; the funnel file records generated -> verified -> hard per round."""
    run = tmp_path / "run"
    exp = run / "iter1" / "expansion"
    hard_args = (f"--model {tiny_model_dir} --max_length 64 --margin 5 --lex_tie -1 --dup_cosine 1.0 "
                 f"--cache_dir {tmp_path / 'emb_cache'}")  # margin 5: every tuple with a candidate is hard
    done = run_rounds(run, server.url, "--hard_jsonl", str(exp / "expansion.hard.jsonl"), "--hard_args", hard_args,
                      "--hard_target", "1000")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = said(done.stdout)
    steps = ["iter1.05_generate.r1", "iter1.06_verify.r1", "iter1.06e_hard.r1",
             "iter1.05_generate.r2", "iter1.06_verify.r2", "iter1.06e_hard.r2"]
    assert [ln.split()[1] for ln in lines if ln.startswith("start ")] == steps
    with_candidates = [r for r in read_jsonl(exp / "expansion.jsonl") if r["negative_candidates"]]
    hard = read_jsonl(exp / "expansion.hard.jsonl")
    assert {r["id"] for r in hard} == {r["id"] for r in with_candidates} and len(hard) > 0
    verified = count_valid(exp / "expansion.jsonl")
    assert f"expansion round 2: {len(hard)} / 1000 hard tuples ({verified} verified, {len(hard)} hard)" in lines
    funnel = read_jsonl(exp / "expansion.jsonl.funnel.jsonl")
    assert [(f["round"], f["generated"]) for f in funnel] == [(1, 8), (2, 16)]
    assert funnel[-1]["verified"] == verified and funnel[-1]["hard"] == len(hard)
    assert (run / "state" / "iter1.expansion.done").read_text() == f"{len(hard)}\n"
    # 06 records the source's score of every candidate for 06e's lexical-tie guard (only with HARD_TUPLES=1)
    assert (run / "logs" / "iter1.06_verify.r1.cmd").read_text().endswith(" --candidate_scores \n")
    assert all(isinstance(c["score"], float) for r in with_candidates for c in r["negative_candidates"])
    assert f"--input_jsonl {exp / 'expansion.jsonl'} --output_jsonl {exp / 'expansion.hard.jsonl'} --model " \
        in (run / "logs" / "iter1.06e_hard.r2.cmd").read_text()

    # a target the first round reaches stops there
    again = run_rounds(tmp_path / "run2", server.url, "--hard_jsonl", str(tmp_path / "run2" / "h.jsonl"),
                       "--hard_args", hard_args, "--hard_target", "1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert [ln.split()[1] for ln in said(again.stdout) if ln.startswith("start ")] == steps[:3]
