"""QUERY_FORM=doc2query (issue 30 section 3): queries written from the documents Stage I found confusing.

The tuples are built from 06b's confused tuples (the file Stage I + 06b write), the queries by 06c's T0-style rewrite
through a real OpenAI-compatible HTTP server on 127.0.0.1; --style mixed asks for the three forms in turn.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from repair.data import DataError, iter_jsonl, read_jsonl, write_jsonl
from repair.expansion.doc2query import SOURCE, doc2query_tuples
from repair.expansion.verification import EXPANSION_REQUIRED
from tests.helpers_sources import FakeServer, openai_route

ROOT = Path(__file__).resolve().parents[1]

P1 = "Cyclin D1 is overexpressed in mantle cell lymphoma through the t(11;14) translocation."
P2 = "BCL2 amplification drives follicular lymphoma relapse after rituximab therapy."
P3 = "Venetoclax binds BCL-2 with sub-nanomolar affinity and induces apoptosis in leukemia cells."
A = "BCL1 rearrangement marks mantle cell lymphoma and predicts poor survival in elderly patients."
B = "Cyclin E expression in breast carcinoma correlates with tamoxifen resistance."
C = "Mantle cell lymphoma responds to ibrutinib in a phase two trial of relapsed patients."
D = "Follicular lymphoma grading by Ki-67 staining shows interobserver variability."
E = "MCL1 inhibition sensitises acute myeloid leukemia cells to venetoclax."


def confused_file(tmp_path: Path) -> Path:
    """06b's format: a confused T0 query, its positive, and D-(q) best first (A outranks two queries' positives)."""
    rows = [
        {"id": "t0:0", "q_new": "Cyclin D1 drives mantle cell lymphoma.", "d_pos": P1,
         "negative_candidates": [{"abstract": A, "t0_index": 3}, {"abstract": B, "t0_index": 4},
                                 {"abstract": C, "t0_index": 5}], "source": "t0_confused"},
        {"id": "t0:1", "q_new": "BCL2 amplification causes follicular lymphoma relapse.", "d_pos": P2,
         "negative_candidates": [{"abstract": "  " + A.replace(" ", "  ") + "\n"}, {"abstract": D}],
         "source": "t0_confused"},
        {"id": "t0:2", "q_new": "Venetoclax targets BCL-2.", "d_pos": P3,
         "negative_candidates": [{"abstract": E}, {"abstract": A}], "source": "t0_confused"},
    ]
    path = tmp_path / "confused_tuples.jsonl"
    write_jsonl(path, rows)
    return path


def test_each_confusing_document_gets_one_tuple_with_what_it_was_confused_with(tmp_path):
    path = confused_file(tmp_path)
    tuples, stats = doc2query_tuples(path, docs_per_query=1)
    assert (stats.confused_queries, stats.documents) == (3, 2)
    by_id = {t["id"]: t for t in tuples}
    assert list(by_id) == ["d2q:t0:0:0", "d2q:t0:2:0"]
    a, e = by_id["d2q:t0:0:0"], by_id["d2q:t0:2:0"]
    # A outranked the positives of t0:0 and t0:1 (the second copy differs only in whitespace: the same document)
    assert a["d_pos"] == A and a["seed_queries"] == ["t0:0", "t0:1"]
    assert [c["abstract"] for c in a["negative_candidates"]] == [P1, P2, B, C, D]
    assert [c["abstract"] for c in e["negative_candidates"]] == [P3, A]
    assert all(t["source"] == SOURCE and t["q_new"] == "" for t in tuples)
    assert stats.candidates == 7
    # two documents per query: B, D and A (third query's second) join; A is still one tuple
    more, stats2 = doc2query_tuples(path, docs_per_query=2, max_candidates=3)
    assert [t["d_pos"] for t in more] == [A, B, D, E] and stats2.documents == 4
    assert all(len(t["negative_candidates"]) <= 3 for t in more)
    assert [c["abstract"] for c in more[0]["negative_candidates"]] == [P1, P2, P3]  # every positive A outranked
    assert [c["abstract"] for c in more[1]["negative_candidates"]] == [P1, A, C]  # B never its own candidate


def test_bad_confused_file_names_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "t0:0", "q_new": "q", "d_pos": "p", "negative_candidates": [{"t0_index": 1}]})
                    + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1: field 'negative_candidates\[0\]\.abstract'"):
        doc2query_tuples(path)
    path.write_text(json.dumps({"id": "t0:0", "q_new": "q", "negative_candidates": []}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1.*d_pos"):
        doc2query_tuples(path)


def _run_06c(args: list[str]) -> dict:
    spec = importlib.util.spec_from_file_location("t0_06c_d2q", ROOT / "expansion" / "06c_t0_style_queries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(args)


def test_06c_doc2query_writes_a_query_per_document_in_mixed_forms_and_resumes(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    t0 = tmp_path / "t0.jsonl"
    t0.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in
                          [("Cyclin D1 drives mantle cell lymphoma.", P1), ("BCL2 causes relapse.", P2),
                           ("Venetoclax targets BCL-2.", P3), ("Ibrutinib works in MCL.", C)]))
    prompts: list[str] = []

    def reply(messages, seed):
        prompt = messages[-1]["content"]
        prompts.append(prompt)
        passage = prompt.rsplit("Passage: ", 1)[1]
        if passage.startswith("Follicular"):  # off topic on every attempt: this document is dropped
            return "Query: Dragons guard ancient castles through elaborate rituals."
        words = re.findall(r"[A-Za-z]{5,}", passage)[:2]
        return f"Query: {words[0]} and {words[1]} in lymphoma patients"

    confused = confused_file(tmp_path)
    out = tmp_path / "expansion.doc2query.jsonl"
    with FakeServer(openai_route(reply, model="gen-model")) as llm:
        base = ["--input_jsonl", str(confused), "--doc2query", "2", "--train_data", str(t0), "--backend", "openai",
                "--openai_url", llm.url + "/v1", "--seed", "3", "--style", "mixed", "--chunk_size", "2",
                "--no_progress", "--out_jsonl", str(out)]
        summary = _run_06c(base)
        asked = len(llm.paths("/v1/chat/completions"))
        again = _run_06c([*base, "--resume"])
        assert len(llm.paths("/v1/chat/completions")) == asked and again["prompts"] == 0
        with pytest.raises(SystemExit, match="no title to keep"):
            _run_06c([*base, "--on_failure", "keep_title"])
    sources = read_jsonl(f"{out}.sources.jsonl")
    assert [s["d_pos"] for s in sources] == [A, B, D, E] and summary["doc2query"]["documents"] == 4
    assert (summary["rewritten"], summary["dropped"], summary["kept_title"]) == (3, 1, 0)
    assert asked == 5  # four documents, the dropped one asked twice
    recs = list(iter_jsonl(out, required=EXPANSION_REQUIRED))  # 06's format: Stage III reads it as is
    assert [r["d_pos"] for r in recs] == [A, B, E]
    for position, asked, rec in zip((0, 1, 3), ("claim", "question", "claim"), recs):
        words = re.findall(r"[A-Za-z]{5,}", rec["d_pos"])[:2]
        assert rec["q_new"] == f"{words[0]} and {words[1]} in lymphoma patients"
        assert rec["query_form"] == "doc2query" and "q_title" not in rec
        assert rec["t0_rewrite"]["style"] == "mixed" and rec["t0_rewrite"]["asked_style"] == asked
        assert rec["negative_candidates"] == sources[position]["negative_candidates"]
    # the forms asked in turn by input position (claim, question, keywords, claim), each prompt ending with the
    # document the query is written from
    first = {}
    for prompt in prompts:
        first.setdefault(prompt.rsplit("Passage: ", 1)[1].removesuffix("\nQuery:"), prompt)
    forms = ("a claim (one declarative sentence) that the passage supports", "a question that the passage answers",
             "a short keyword query the passage is relevant to", "a claim (one declarative sentence) that the passage "
             "supports")
    for doc, form in zip([A, B, D, E], forms):
        assert f"last passage as {form} (the examples show" in first[doc]


def test_doc2query_settings_are_checked_up_front(tmp_path):
    from repair.driver.settings import resolve, validate

    env = {"TRAIN_DATA": str(ROOT / "data" / "demo" / "scifact-demo"), "OUT_DIR": str(tmp_path),
           "QUERY_FORM": "doc2query", "QUERY_STYLE": "mixed", "D2Q_DOCS": "2"}
    assert validate(resolve(env, ROOT), env) == []
    problems = validate(resolve({**env, "JUDGE": "1", "D2Q_DOCS": "0", "QUERY_STYLE": "poem"}, ROOT),
                        {**env, "JUDGE": "1", "D2Q_DOCS": "0", "QUERY_STYLE": "poem"})
    assert any("QUERY_FORM=doc2query writes none" in p for p in problems)
    assert any(p.startswith("D2Q_DOCS must be in 1..2147483647, got 0") for p in problems)
    assert "QUERY_STYLE must be auto, claim, question, keywords, title or mixed, got 'poem'" in problems
    # the setting offers exactly what 06c's --style accepts (the two lists are written in two places)
    spec = importlib.util.spec_from_file_location("t0_06c_choices", ROOT / "expansion" / "06c_t0_style_queries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    choices = next(a.choices for a in module.build_parser()._actions if a.dest == "style")
    from repair.driver.settings import BY_NAME
    assert set(BY_NAME["QUERY_STYLE"].choices) == set(choices) and len(choices) == 6


def test_examples_can_be_cut_shorter_than_the_passage_written_from():
    from repair.expansion.t0_style import build_t0_style_prompt

    example, passage = "e" * 50 + " " + "x" * 900, "p" * 40 + " " + "y" * 700
    short = build_t0_style_prompt([("Claim one.", example)], passage, "claim", 1000, max_example_chars=30)
    assert build_t0_style_prompt([("Claim one.", example)], passage, "claim", 1000).count("x" * 900) == 1
    assert "xxxxx" not in short and "Passage: " + "e" * 30 in short and short.endswith(f"Passage: {passage}\nQuery:")  # the passage itself stays whole


def test_06c_contrast_shows_the_confused_passage_and_rejects_a_query_that_fits_it_as_well(tmp_path, monkeypatch):
    """--contrast: each document's prompt shows the positive it outranked (its first candidate) as a passage the
    query must not fit; a query sharing more content words with that passage than with its own is rejected
    (not_distinct) and asked again; the file records the option, and resuming it without the option is refused."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    t0 = tmp_path / "t0.jsonl"
    t0.write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in
                          [("Ibrutinib works in MCL.", C), ("Ki-67 grading varies.", D)]))
    prompts: list[str] = []

    def reply(messages, seed):
        prompt = messages[-1]["content"]
        prompts.append(prompt)
        if prompt.rsplit("Passage: ", 1)[1].startswith("BCL1"):  # A, whose confused passage is P1 (cyclin D1)
            asked_before = sum(p.rsplit("Passage: ", 1)[1].startswith("BCL1") for p in prompts) > 1
            return ("Elderly patients with BCL1 rearrangement survive poorly." if asked_before
                    else "Cyclin overexpressed mantle lymphoma translocation")  # P1's words: fits P1 better
        return "MCL1 inhibition sensitises myeloid cells."  # E against P3 (venetoclax): distinct at once

    out = tmp_path / "expansion.contrast.jsonl"
    with FakeServer(openai_route(reply, model="gen-model")) as llm:
        base = ["--input_jsonl", str(confused_file(tmp_path)), "--doc2query", "1", "--train_data", str(t0),
                "--backend", "openai", "--openai_url", llm.url + "/v1", "--seed", "3", "--k", "1",
                "--no_progress", "--out_jsonl", str(out)]
        summary = _run_06c([*base, "--contrast"])
        with pytest.raises(ValueError, match="written with contrast=True, not None"):
            _run_06c([*base, "--resume"])
    assert (summary["rewritten"], summary["dropped"], summary["rejected"]) == (2, 0, {"not_distinct": 1})
    recs = read_jsonl(out)
    assert [(r["d_pos"], r["q_new"]) for r in recs] == [
        (A, "Elderly patients with BCL1 rearrangement survive poorly."), (E, "MCL1 inhibition sensitises myeloid cells.")]
    assert recs[0]["t0_rewrite"]["rejected"] == ["not_distinct"] and recs[0]["t0_rewrite"]["contrast"] is True
    first_a = next(p for p in prompts if p.rsplit("Passage: ", 1)[1].startswith("BCL1"))
    assert first_a.endswith(f"Related passage (not this one): {P1}\n\nPassage: {A}\nQuery:")
    assert "must fit the last passage and not the related passage shown just before it" in first_a


def test_the_contrast_option_leaves_the_default_prompt_as_it_was():
    """Without a contrast passage the prompt is the one every measured run used (the same text, word for word)."""
    from repair.expansion.t0_style import build_t0_style_prompt

    prompt = build_t0_style_prompt([("Claim one.", "Example passage.")], "The passage.", "claim", 1000)
    assert prompt == (
        "Below are queries from a retrieval training set, each after the passage it retrieves. Write one new query for "
        "the last passage in the same style: a claim (one declarative sentence) that the passage supports. Match the "
        "examples' form and length, and do not copy a sentence of the passage. Write only the query, on one line.\n\n"
        "Passage: Example passage.\nQuery: Claim one.\n\nPassage: The passage.\nQuery:")
