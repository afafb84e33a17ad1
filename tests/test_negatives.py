"""CausalNeg negatives (repair/differentiation/causalneg/, differentiation/09b_counterfactual_negatives.py): prompt building, tolerant
parsing of recorded generator outputs (malformed ones included), stage-2 planning, corpus baselines with positives
excluded, the whole step against a real OpenAI-compatible HTTP server (retries, failures counted, traces, resume,
reuse of generations) and against a tiny random local model that only writes garbage."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from repair.differentiation.causalneg.generate import GenerationSettings, GenerationStats, generate_negatives, plan_perturbations
from repair.differentiation.causalneg.inputs import CorpusNegatives, item_key, load_items
from repair.differentiation.causalneg.parsing import clean_passage, parse_requirements
from repair.differentiation.causalneg.pipeline import CONFIGS, augmented_keys, run_negatives
from repair.differentiation.causalneg.prompts import PERTURBATIONS, build_decompose_prompt, build_vanilla_prompt, build_write_prompt
from repair.data import DataError, load_beir, read_jsonl
from tests.helpers_generation import build_tiny_causal
from tests.helpers_sources import FakeServer, openai_route

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "demo" / "scifact-tiny"
SCRIPT = ROOT / "differentiation" / "09b_counterfactual_negatives.py"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> CorpusNegatives:
    return CorpusNegatives(TINY, index_dir=tmp_path_factory.mktemp("bm25") / "idx")


# ---------------------------------------------------------------------------------------------- stage 1 parsing
# Recorded stage-1 outputs (hand-written in the shapes small and large models produce).
REQ_JSON_TRAILING = ('{"requirements": [{"requirement": "names clathrin as the protein at the spindle", '
                     '"perturbation": "entity_substitution"}, {"requirement": "reports the effect during mitosis", '
                     '"perturbation": "Constraint violation"}, {"requirement": "shows that depletion destabilises '
                     'kinetochore fibres"}]}\nI hope this helps! Let me know if you need more.')
REQ_FENCED_LIST = ('Sure! Here are the requirements:\n```json\n["identifies the enzyme that cleaves APP", '
                   '"reports results in adults over 65 years", "identifies the enzyme that cleaves APP"]\n```')
REQ_NUMBERED = ("Here is a list of the requirements:\n\n"
                "1. Bone regeneration:\n   - uses calcium phosphate nanoparticles as the scaffold material\n"
                "2) reports outcomes in rats after eight weeks [constraint_violation]\n"
                "3. **Requirement 3:** measures new bone volume by micro-CT -> entity substitution\n"
                "4. The document must satisfy all three requirements listed above.\n")
REQ_LABELLED = "Requirement 1: names the receptor PD-1\nRequirement 2: studies tumour-bearing mice (requirement drift)"
REQ_PROSE = "The passage is structured in five sentences with several clauses. It is relevant because it is."
REQ_WRONG_KEY = '{"items": ["names the receptor PD-1", "studies mice"], "note": "done"}'
REQ_TRUNCATED = '{"requirements": ["names the receptor PD-1 on T cells", "studies tumour-bear'
REQ_ECHO = ("1. names the enzyme that cleaves the precursor protein [entity_substitution]\n"
            "2. 0-dimensional biomaterials lack inductive properties.")


def test_parse_requirements_json_with_trailing_text_and_types():
    reqs, reason = parse_requirements(REQ_JSON_TRAILING, "Clathrin stabilises the mitotic spindle.")
    assert reason == "ok"
    assert reqs == [
        {"requirement": "names clathrin as the protein at the spindle", "perturbation": "entity_substitution"},
        {"requirement": "reports the effect during mitosis", "perturbation": "constraint_violation"},
        {"requirement": "shows that depletion destabilises kinetochore fibres", "perturbation": None}]
    assert parse_requirements(REQ_JSON_TRAILING, k=2)[0] == reqs[:2]  # at most K, in chain order


def test_parse_requirements_fenced_json_list_dedupes():
    reqs, reason = parse_requirements(REQ_FENCED_LIST)
    assert reason == "ok"
    assert [r["requirement"] for r in reqs] == ["identifies the enzyme that cleaves APP",
                                                "reports results in adults over 65 years"]


def test_parse_requirements_numbered_list_with_sub_bullets_types_and_meta_items():
    reqs, reason = parse_requirements(REQ_NUMBERED)
    assert reason == "ok"
    assert reqs == [
        {"requirement": "Bone regeneration: uses calcium phosphate nanoparticles as the scaffold material",
         "perturbation": None},
        {"requirement": "reports outcomes in rats after eight weeks", "perturbation": "constraint_violation"},
        {"requirement": "measures new bone volume by micro-CT", "perturbation": "entity_substitution"}]
    # item 4 talks about the task itself and is dropped


def test_parse_requirements_labelled_lines():
    reqs, reason = parse_requirements(REQ_LABELLED)
    assert reason == "ok"
    assert reqs == [{"requirement": "names the receptor PD-1", "perturbation": None},
                    {"requirement": "studies tumour-bearing mice", "perturbation": "requirement_drift"}]


@pytest.mark.parametrize("raw,reason", [("", "empty"), ("   \n ", "empty"), (REQ_PROSE, "no_list"),
                                        (REQ_WRONG_KEY, "wrong_key"), (REQ_TRUNCATED, "no_list"),
                                        ("1. ok\n2. too short", "no_valid_requirement")])
def test_parse_requirements_malformed(raw, reason):
    assert parse_requirements(raw) == ([], reason)


def test_parse_requirements_drops_echoes_of_the_prompt_example_and_the_query():
    query = "0-dimensional biomaterials lack inductive properties."
    assert parse_requirements(REQ_ECHO, query) == ([], "no_valid_requirement")


# ---------------------------------------------------------------------------------------------- stage 3 parsing
POSITIVE = ("Clathrin has an established function in the generation of vesicles that transfer membrane and proteins "
            "around the cell. Here, we show that clathrin stabilizes fibres of the mitotic spindle to aid congression "
            "of chromosomes.")
GOOD = ("Dynamin has an established function in the scission of vesicles at the plasma membrane. Here, we show that "
        "dynamin does not bind the mitotic spindle and that its depletion leaves chromosome congression intact in "
        "HeLa cells.")


def test_clean_passage_strips_preamble_label_markdown_and_unfinished_sentence():
    raw = f"Sure! Here is the document:\n\n**Document:** \"{GOOD} Further work in primary cells is ongoing and"
    text, reason = clean_passage(raw, POSITIVE)
    assert (text, reason) == (GOOD, "ok")


@pytest.mark.parametrize("raw,reason", [
    ("", "empty"),
    ("Here is the document:", "empty"),
    ("Dynamin binds the spindle in HeLa cells.", "too_short"),
    ("Example 1: " + GOOD, "echo"),
    ("This document meets the requirement because " + GOOD, "meta"),
    ("Please go ahead and ask your questions. " + GOOD, "meta"),
    ("1. I will describe how " + GOOD, "meta"),
    (POSITIVE.replace("Here, we", "Here we"), "copy"),
    ("the cell divides and " * 12, "repetitive"),
    ("1234 5678 9012 3456 7890 1234 5678 9012 3456 7890 1234 5678 9012 3456 7890 12 34 56 78 90 a b c d e f",
     "not_text"),
])
def test_clean_passage_rejections(raw, reason):
    assert clean_passage(raw, POSITIVE) == (None, reason)


def test_clean_passage_duplicate_of_an_accepted_negative():
    assert clean_passage(GOOD, POSITIVE, others=[GOOD.upper()]) == (None, "duplicate")


# ---------------------------------------------------------------------------------------------- prompts
def test_prompts_carry_query_positive_requirement_perturbation_and_style_refs():
    p1 = build_decompose_prompt("Clathrin stabilises the spindle.", POSITIVE * 20, k=4, max_doc_chars=300)
    assert "list the 4 information requirements" in p1 and "Query: Clathrin stabilises the spindle." in p1
    assert "entity_substitution" in p1 and "numbered list" in p1 and '{"requirements"' in p1
    doc_line = next(ln for ln in p1.splitlines() if ln.startswith("Relevant document: "))
    assert len(doc_line) <= len("Relevant document: ") + 300 + 4 and doc_line.endswith(" ...")
    p3 = build_write_prompt("Clathrin stabilises the spindle.", POSITIVE, "names clathrin", "constraint_violation",
                            ["Ref one text.", "Ref two text."], target_words=90)
    assert "Example 1: Ref one text.\nExample 2: Ref two text." in p3
    assert "satisfies this requirement of the query: names clathrin" in p3
    assert PERTURBATIONS["constraint_violation"] in p3 and "about 90 words" in p3 and p3.endswith("Document:")
    with pytest.raises(ValueError, match="unknown perturbation"):
        build_write_prompt("q", "d", "r", "negation", [])
    pv = build_vanilla_prompt("Clathrin stabilises the spindle.", POSITIVE)
    assert "hard negative" in pv and "requirement" not in pv and POSITIVE in pv


# ---------------------------------------------------------------------------------------------- stage 2
REQS = [{"requirement": f"r{i}", "perturbation": None} for i in range(4)]


def test_plan_front_back_random_and_type_coverage():
    front = plan_perturbations(REQS, 3, "front")
    assert [(p["requirement_index"], p["perturbation"]) for p in front] == [
        (0, "entity_substitution"), (1, "requirement_drift"), (2, "constraint_violation")]
    back = plan_perturbations(REQS, 3, "back")
    assert sorted(p["requirement_index"] for p in back) == [1, 2, 3]
    assert {p["perturbation"] for p in back} == set(PERTURBATIONS)
    rnd = plan_perturbations(REQS, 3, "random", random.Random(7))
    expected = list(range(4))
    random.Random(7).shuffle(expected)
    assert [p["requirement_index"] for p in rnd] == expected[:3]


def test_plan_uses_model_suggestions_and_reuses_a_short_chain_with_new_types():
    reqs = [{"requirement": "a", "perturbation": None}, {"requirement": "b", "perturbation": "entity_substitution"}]
    plan = plan_perturbations(reqs, 3, "front")
    assert [(p["requirement"], p["perturbation"], p["perturbation_from"]) for p in plan] == [
        ("a", "requirement_drift", "rotation"), ("b", "entity_substitution", "model"),
        ("a", "constraint_violation", "rotation")]
    one = plan_perturbations(reqs[:1], 3, "front")
    assert [p["perturbation"] for p in one] == list(PERTURBATIONS)  # one requirement, three different violations
    assert plan_perturbations([], 3) == [] and plan_perturbations(REQS, 0) == []
    with pytest.raises(ValueError):
        plan_perturbations(REQS, 3, "middle")


# ---------------------------------------------------------------------------------------------- input and baselines
def test_load_items_beir_groups_positives(tmp_path):
    items, counts = load_items(TINY, "train")
    data = load_beir(TINY, "train")
    assert counts["format"] == "beir:train" and len(items) == len(data.qrels) == counts["items"]
    for item in items:
        pos_ids = {d for d, s in data.qrels[item.id].items() if s > 0}
        assert item.positive_ids == frozenset(pos_ids)
        assert item.positives == frozenset(data.doc_text(d) for d in pos_ids)
        assert item.key == item_key(item.query, item.positive)


def test_load_items_seed_jsonl_and_triplets(tmp_path):
    seed = tmp_path / "seed.jsonl"
    seed.write_text("\n".join(json.dumps(r) for r in [
        {"query": "q1", "positive": "p1"}, {"query": "q1", "positive": "p2"}, {"query": "q2", "positive": "p3"},
        {"query": "q2", "positive": "p3"}]) + "\n")
    items, counts = load_items(seed)
    assert [(i.query, i.positive, sorted(i.positives)) for i in items] == [
        ("q1", "p1", ["p1", "p2"]), ("q1", "p2", ["p1", "p2"]), ("q2", "p3", ["p3"])]
    assert counts["duplicate_items"] == 1
    trip = tmp_path / "final_train_data.bottom_30pct.jsonl"
    trip.write_text(json.dumps({"id": "t0", "query": "q", "pos_document": "d", "hard_negatives": ["n1", "n2"],
                                "hard_negative_scores": [0.5, 0.4], "d_neg": "n1", "pos_rank": 1,
                                "concepts": ["c"]}) + "\n")
    (item,), counts = load_items(trip)
    assert counts["format"] == "triplets"
    assert (item.id, item.negatives, item.scores, item.sources, item.traces) == (
        "t0", ["n1", "n2"], [0.5, 0.4], ["mined", "mined"], [None, None])
    assert item.extra == {"id": "t0", "pos_rank": 1, "concepts": ["c"]}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "pos_document": "d", "hard_negatives": ["n1"],
                               "negative_sources": ["mined", "generated"]}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: field 'negative_sources' has 2 entries"):
        load_items(bad)


def test_bm25_negatives_exclude_positives_and_follow_bm25_order(corpus):
    items, _ = load_items(TINY, "train")
    for item in items:
        negs = corpus.bm25(item, 15)
        # independent check: the index's own ranking with positives (by id) removed
        ranked = [p for p in corpus.index.search(item.query, len(corpus.texts)) if p.id not in item.positive_ids]
        assert [n.doc_id for n in negs] == [p.id for p in ranked[:15]]
        assert all(n.text not in item.positives for n in negs)
        assert [n.score for n in negs] == sorted((n.score for n in negs), reverse=True)
        assert len(negs) == min(15, len(ranked))


def test_random_negatives_are_distinct_non_positive_and_seeded(corpus):
    items, _ = load_items(TINY, "train")
    item = items[0]
    a = corpus.random(item, 15, random.Random("s"))
    b = corpus.random(item, 15, random.Random("s"))
    assert [n.doc_id for n in a] == [n.doc_id for n in b]
    assert len({n.doc_id for n in a}) == 15 and not {n.doc_id for n in a} & item.positive_ids
    assert all(n.score is None and n.method == "random" for n in a)


def test_augmented_keys_exact_count_and_order_free():
    items, _ = load_items(TINY, "train")
    keys = augmented_keys(items, 0.25, seed=3)
    assert len(keys) == round(0.25 * len(items)) == 4
    assert augmented_keys(list(reversed(items)), 0.25, seed=3) == keys
    assert augmented_keys(items, 0.0, 3) == set() and len(augmented_keys(items, 1.0, 3)) == len(items)
    with pytest.raises(ValueError):
        augmented_keys(items, 1.5, 3)


@pytest.mark.parametrize("name", ["random", "mined"])
def test_corpus_baselines_write_configured_counts(tmp_path, corpus, name):
    items, _ = load_items(TINY, "train")
    out = tmp_path / f"{name}.jsonl"
    res = run_negatives(items, out, CONFIGS[name], corpus=corpus, progress=False)
    rows = read_jsonl(out)
    assert res["mined_from"] == ("random" if name == "random" else "bm25") and len(rows) == len(items)
    fewer = 0
    for item, row in zip(items, rows):
        # BM25 finds only documents sharing a term with the query: on this 80-document corpus often < 15
        hits = [p for p in corpus.index.search(item.query, 100) if p.id not in item.positive_ids]
        n = 15 if name == "random" else min(15, len(hits))
        fewer += n < 15
        assert len(row["hard_negatives"]) == n and row["d_neg"] == (row["hard_negatives"][0] if n else None)
        assert not set(row["hard_negatives"]) & item.positives
        assert row["negative_sources"] == ["mined"] * n
        assert all(t["method"] == ("random" if name == "random" else "bm25") for t in row["negative_traces"])
        assert len(row["hard_negative_scores"]) == n
    assert res["fewer_corpus_negatives"] == fewer and res["corpus_negatives"] == sum(
        len(r["hard_negatives"]) for r in rows)
    assert res["trainer_flags"] == ["--num_hard_negatives", "-1", "--qem_lambda", "0"]
    assert CONFIGS["causalneg"].trainer_flags() == ["--num_hard_negatives", "-1", "--qem_lambda", "0.1",
                                                    "--qem_tau", "0.1"]


# ---------------------------------------------------------------------------------------------- the step over HTTP
def _scripted_reply():
    """An OpenAI-compatible server's answers: stage 1 malformed once per query then a list, one query always
    malformed; stage 3 an empty preamble on the first constraint violation, otherwise a document that spells out
    the requirement and perturbation it was asked for; vanilla a document per seed."""
    calls: dict[str, int] = {}

    def reply(messages, seed):
        prompt = messages[-1]["content"]
        calls[prompt] = calls.get(prompt, 0) + 1
        query = next(ln for ln in prompt.splitlines() if "query: " in ln.lower()).split(": ", 1)[1]
        if prompt.startswith("You analyse"):
            if "Dscam1" in query:
                return "I cannot help with that."
            if calls[prompt] == 1:
                return "The document is relevant because it discusses the topic in depth."
            return ("1. names the specific molecule studied in the claim [entity_substitution]\n"
                    "2. reports the measured effect in the stated population [constraint_violation]")
        if prompt.startswith("You write documents"):
            req = prompt.split("requirement of the query: ", 1)[1].split("\n", 1)[0]
            kind = next(k for k, v in PERTURBATIONS.items() if v in prompt)
            if kind == "constraint_violation" and calls[prompt] == 1:
                return "Here is the document:"
            return (f"A cohort study of {len(req) * 7} adult patients examined {kind.replace('_', ' ')}: {req}. "
                    f"The results were measured over two years and compared with matched controls from three "
                    f"hospitals in the region.")
        return (f"Variant {seed}: a related study of cell signalling in cultured fibroblasts reported changes in "
                f"growth rate and protein expression, but did not address the question of the claim at all.")

    return reply


def _run(args, subprocess_run: bool = False):
    """The script as a user runs it (a subprocess), or its main() in this process (no import cost)."""
    argv = [*map(str, args), "--no_progress"]
    if not subprocess_run:
        spec = importlib.util.spec_from_file_location("step10_negatives", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.main(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_causalneg_step_over_http_traces_retries_failures_and_resume(tmp_path, corpus):
    items, _ = load_items(TINY, "train")
    vitamin = [i for i in items if "Dscam1" in i.query]
    env_idx = tmp_path / "idx"
    with FakeServer(openai_route(_scripted_reply(), model="served")) as srv:
        common = ["--input", TINY, "--split", "train", "--corpus", TINY, "--index_dir", env_idx, "--backend",
                  "openai", "--openai_url", srv.url + "/v1", "--num_mined", 5, "--k", 3, "--max_retries", 2,
                  "--chunk_size", 4]
        out = tmp_path / "causalneg.jsonl"
        first = _run(["--config", "causalneg", *common, "--output_jsonl", out, "--max_items", 6], subprocess_run=True)
        again = _run(["--config", "causalneg", *common, "--output_jsonl", out, "--resume"])
        vanilla = tmp_path / "vanilla.jsonl"
        van = _run(["--config", "vanilla", *common, "--output_jsonl", vanilla, "--ratio", 0.5])
    rows = read_jsonl(out)
    assert first["written"] == 6 and again["skipped_done"] == 6 and again["written"] == len(items) - 6
    assert [r["key"] for r in rows] == [i.key for i in items]  # every query once, in input order
    gen = first["generation"]
    # stage 1: every query malformed once, then ok on the retry -- except the Dscam1 one (3 attempts each)
    n_vit = sum(1 for i in items[:6] if "Dscam1" in i.query)
    assert gen["calls"]["decompose"] == 2 * (6 - n_vit) + 3 * n_vit
    assert gen["rejected"]["decompose"] == {"no_list": 6 - n_vit + 3 * n_vit}
    assert gen["items_failed_decompose"] == n_vit
    # stage 3: 3 writes per decomposed query; the first constraint violation of each is empty, then retried
    assert gen["ok"]["write"] == 3 * (6 - n_vit) and gen["rejected"]["write"] == {"empty": 6 - n_vit}
    assert gen["negatives_failed"] == 3 * n_vit
    for item, row in zip(items, rows):
        sources, traces = row["negative_sources"], row["negative_traces"]
        assert len(sources) == len(traces) == len(row["hard_negatives"]) == len(row["hard_negative_scores"])
        n_mined = min(5, len([p for p in corpus.index.search(item.query, 100) if p.id not in item.positive_ids]))
        assert sources[:n_mined] == ["mined"] * n_mined and not set(row["hard_negatives"]) & item.positives
        generated = [(t, n) for s, t, n in zip(sources, traces, row["hard_negatives"]) if s == "generated"]
        if item in vitamin:
            assert generated == [] and row["generation"] == {"method": "cot", "requested": 3, "written": 0}
            continue
        assert [t["perturbation"] for t, _ in generated] == ["entity_substitution", "constraint_violation",
                                                             "requirement_drift"]
        assert [t["requirement_index"] for t, _ in generated] == [0, 1, 0]
        for trace, text in generated:
            assert trace["method"] == "cot" and trace["position"] == "front" and len(trace["style_refs"]) == 2
            assert f"{trace['perturbation'].replace('_', ' ')}: {trace['requirement']}." in text
        assert row["hard_negative_scores"][n_mined:] == [None] * 3 and None not in row["hard_negative_scores"][:n_mined]
    stats = json.loads((tmp_path / "causalneg.jsonl.stats.json").read_text())
    assert stats["finished"] and stats["file"]["lines"] == len(items)
    assert stats["trainer_flags"][-4:] == ["--qem_lambda", "0.1", "--qem_tau", "0.1"]
    # vanilla baseline: generated only, half of the queries augmented, k samples of the single prompt each
    vrows = read_jsonl(vanilla)
    aug = [r for r in vrows if r["generation"]["requested"]]
    assert van["augmented"] == len(aug) == round(0.5 * len(items))
    assert all(r["negative_sources"] == ["generated"] * 3 and r["negative_traces"][0]["method"] == "vanilla"
               for r in aug)
    assert all(r["hard_negatives"] == [] and r["d_neg"] is None for r in vrows if r not in aug)


def test_mixture_reuses_vanilla_generations(tmp_path, corpus):
    items, _ = load_items(TINY, "train")
    with FakeServer(openai_route(_scripted_reply(), model="served")) as srv:
        from repair.expansion.generation import OpenAIGenerator

        gen = OpenAIGenerator(srv.url + "/v1")
        settings = GenerationSettings(k=2)
        run_negatives(items, tmp_path / "v.jsonl", CONFIGS["vanilla"], generator=gen, ratio=0.5, settings=settings,
                      progress=False)
        n_requests = len(srv.paths("/v1/chat/completions"))
    res = run_negatives(items, tmp_path / "m.jsonl", CONFIGS["mixture"], corpus=corpus, ratio=0.5,
                        settings=settings, generated_from=tmp_path / "v.jsonl", num_mined=4, progress=False)
    assert n_requests == 8 * 2 and res["reused_generated"] == 16 and res["generation"]["calls"] == {}
    van = {r["key"]: r for r in read_jsonl(tmp_path / "v.jsonl")}
    for row in read_jsonl(tmp_path / "m.jsonl"):
        n_mined = row["negative_sources"].count("mined")
        assert n_mined <= 4 and row["hard_negatives"][n_mined:] == van[row["key"]]["hard_negatives"]
        assert row["negative_sources"] == ["mined"] * n_mined + ["generated"] * len(van[row["key"]]["hard_negatives"])
    with pytest.raises(DataError, match="made by method 'vanilla'"):
        run_negatives(items, tmp_path / "c.jsonl", CONFIGS["causalneg"], corpus=corpus, ratio=0.5,
                      generated_from=tmp_path / "v.jsonl", progress=False)


def test_existing_output_needs_resume(tmp_path, corpus):
    items, _ = load_items(TINY, "train")
    out = tmp_path / "o.jsonl"
    run_negatives(items[:2], out, CONFIGS["mined"], corpus=corpus, progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        run_negatives(items, out, CONFIGS["mined"], corpus=corpus, progress=False)
    with pytest.raises(ValueError, match="need a corpus"):
        run_negatives(items, tmp_path / "x.jsonl", CONFIGS["random"], progress=False)


def test_resume_skips_a_partial_last_line_but_names_a_corrupt_one(tmp_path, corpus):
    """--resume reads the done items with the project's appended-file reader: the half line of a killed run is
    redone, a corrupt whole line is an error naming file and line (it used to be skipped, and its item redone)."""
    items, _ = load_items(TINY, "train")
    out = tmp_path / "o.jsonl"
    run_negatives(items[:2], out, CONFIGS["mined"], corpus=corpus, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + lines[1][:20])
    result = run_negatives(items[:2], out, CONFIGS["mined"], corpus=corpus, resume=True, progress=False)
    assert result["skipped_done"] == 1 and result["file"]["lines"] == 2
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == [items[0].key, items[1].key]
    out.write_text(lines[0] + "{not json\n" + lines[1])
    with pytest.raises(DataError, match=r"o.jsonl:2: invalid JSON"):
        run_negatives(items[:2], out, CONFIGS["mined"], corpus=corpus, resume=True, progress=False)


def test_a_resume_with_other_settings_is_refused_in_one_line(tmp_path):
    """Issue 44: 09b --resume skipped the queries already written and appended the rest made with the new settings
    (another --num_mined, another seed), exit 0. Now it stops before any work with one line naming each difference;
    a resume with the same settings still goes on where the file stopped."""
    out = tmp_path / "mined.jsonl"
    common = ["--config", "mined", "--input", TINY, "--split", "train", "--corpus", TINY, "--index_dir",
              tmp_path / "idx", "--output_jsonl", out]
    _run([*common, "--num_mined", 5, "--max_items", 3])
    before = out.read_text()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, common), "--num_mined", "4", "--seed", "7",
                           "--resume", "--no_progress"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {out}: cannot --resume a file made with other settings (num_mined: the file was made with 5, now 4; "
        "settings.seed: the file was made with 42, now 7); rerun with its settings or choose another --output_jsonl")
    assert out.read_text() == before
    again = _run([*common, "--num_mined", 5, "--resume"])
    assert again["skipped_done"] == 3 and again["written"] == again["items"] - 3


# ---------------------------------------------------------------------------------------------- a real (tiny) model
def test_tiny_local_model_garbage_is_counted_and_survived(tmp_path):
    """A random-weight causal LM writes garbage: every output is rejected, retried, counted; lines still come out."""
    from repair.expansion.generation import HFGenerator

    model_dir = build_tiny_causal(tmp_path / "tiny_causal")
    items, _ = load_items(TINY, "train")
    gen = HFGenerator(str(model_dir), device="cpu", batch_size=8)
    settings = GenerationSettings(k=2, max_retries=1, decompose_tokens=12, write_tokens=12)
    stats = GenerationStats()
    out = generate_negatives(gen, items[:3], "cot", settings, stats)
    assert out == {i.key: [] for i in items[:3]}
    assert stats.calls["decompose"] == 6 and sum(stats.rejected["decompose"].values()) == 6
    assert stats.items_failed_decompose == 3 and stats.negatives_failed == 6
    stats = GenerationStats()
    out = generate_negatives(gen, items[:2], "vanilla", settings, stats)
    assert sum(len(v) for v in out.values()) == 0 and stats.calls["vanilla"] == 8 and stats.negatives_failed == 4
    assert sum(stats.rejected["vanilla"].values()) == 8


def test_clean_passage_accepts_real_abstracts():
    """The checks reject generator failures, not corpus text: real SciFact abstracts pass (a few talk like a
    chat assistant, "please" / "here is", and are the only ones rejected)."""
    reasons = {}
    for line in (ROOT / "data" / "demo" / "scifact-demo" / "corpus.jsonl").read_text().splitlines():
        doc = json.loads(line)
        text = f"{doc['title']} {doc['text']}".strip()
        reasons[doc["_id"]] = clean_passage(text, "")[1]
    ok = sum(r == "ok" for r in reasons.values())
    assert ok / len(reasons) >= 0.95 and set(reasons.values()) <= {"ok", "meta"}


# ---------------------------------------------------------------------------------------------- the package
def _loaded_by(module: str) -> set[str]:
    """The repair modules (and torch) that importing ``module`` pulls in, in a fresh interpreter."""
    probe = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
             "print(' '.join(m for m in sys.modules if m == 'torch' or m.startswith('repair.')))")
    out = subprocess.run([sys.executable, "-c", probe, module], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(out.stdout.split())


def test_causalneg_package_rooms_and_layering():
    """repair/differentiation/causalneg/ holds one idea per module (each with a docstring, under 500 lines) in place
    of the old 1,081-line repair/negatives.py; the step needs neither torch nor the trainer, only the dynamics (now
    repair/training/causalneg_dynamics.py) reach the trainer, and the trainer's data layer takes the source names from
    the file contract (repair.data, one definition, re-exported by the package) without loading any CausalNeg module."""
    import repair.training.losses
    import repair.training.data
    from repair.differentiation.causalneg import GENERATED, MINED, NEGATIVE_SOURCES

    modules = sorted((ROOT / "repair" / "differentiation" / "causalneg").glob("*.py"))
    assert [m.stem for m in modules] == ["__init__", "diagnostics", "generate", "inputs", "parsing", "pipeline",
                                         "prompts"]
    modules.append(ROOT / "repair" / "training" / "causalneg_dynamics.py")  # the one that reads a training run
    for path in modules:
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) < 500 and ast.get_docstring(ast.parse(text)), path
    assert not any((ROOT / "repair" / old).exists() for old in ("negatives.py", "negative_diagnostics.py"))
    step = _loaded_by("repair.differentiation.causalneg.pipeline")
    assert "torch" not in step and "repair.training.trainer" not in step
    assert "repair.differentiation.causalneg.diagnostics" not in step
    assert "repair.training.trainer" not in _loaded_by("repair.differentiation.causalneg.diagnostics")
    assert not {m for m in _loaded_by("repair.training.data") if m.startswith("repair.differentiation")}
    assert (MINED, GENERATED) == NEGATIVE_SOURCES == ("mined", "generated")
    assert repair.training.data.SOURCES is NEGATIVE_SOURCES and not hasattr(repair.training.losses, "SOURCES")
