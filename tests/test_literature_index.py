"""The on-disk literature index (issue 41): built from each input format (BEIR, JSONL, S2 papers + abstracts shards),
searched with bm25s' analyzer and Lucene's BM25 at k1 = 1.2, resumed after a kill, idempotent, refused with one line
when corrupt or built differently, searched by two processes at once, and verifying like the bm25s source in 06."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repair.data import DataError, read_json, read_jsonl, write_json
from repair.expansion.sources import make_source
from repair.expansion.sources.literature import build_index
from repair.expansion.sources.literature_format import MANIFEST, MAX_TEXT_CHARS, STOPWORDS_EN, LiteratureIndexError
from repair.expansion.sources.literature_search import LiteratureIndex
from repair.expansion.sources.local_corpus import LocalCorpus, _tokenize
from repair.expansion.verification import run_verification

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "expansion"
PAPERS = FIXTURES / "papers.jsonl"
CLI = [sys.executable, "-m", "repair.expansion.sources.literature"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def write_jsonl_gz(path: Path, rows: list[dict], gz: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture(scope="module")
def fixture_index(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lit") / "index"
    build_index([PAPERS], folder, progress=False)
    return folder


def bm25_lucene(docs: list[str], query: str, k1: float = 1.2, b: float = 0.75) -> list[tuple[float, int]]:
    """Lucene's BM25 from its definition over bm25s' tokens (each query occurrence counted), score > 0, best first."""
    import math
    from collections import Counter

    toks = _tokenize(docs, return_ids=False)
    n, avgdl = len(toks), sum(map(len, toks)) / len(toks)
    df = Counter(t for d in toks for t in set(d))
    q = _tokenize([query], return_ids=False)[0]
    out = []
    for i, d in enumerate(toks):
        tf = Counter(d)
        s = sum(math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf[t] / (tf[t] + k1 * (1 - b + b * len(d) / avgdl))
                for t in q if tf[t])
        if s > 0:
            out.append((s, i))
    return sorted(out, key=lambda t: (-t[0], t[1]))


def test_stopwords_are_bm25s_english_list():
    from bm25s.stopwords import STOPWORDS_EN as BM25S_EN

    assert sorted(STOPWORDS_EN) == sorted(BM25S_EN)


@pytest.mark.parametrize("exact,k1", [(True, 1.5), (False, 1.2)])
@pytest.mark.parametrize("query", ["graphene mobility pressure", "BCL-2 venetoclax apoptosis", "mantle cell lymphoma",
                                   "perovskite perovskite solar", "T cells"])
def test_scores_are_lucene_bm25_over_bm25s_tokens(fixture_index, query, exact, k1):
    """Exact rescoring (06's default) gives bm25s' k1 1.5; the engine's own ranking tantivy's fixed k1 1.2."""
    papers = read_jsonl(PAPERS)
    docs = [f"{p.get('title') or ''} {p.get('abstract') or ''}".strip() for p in papers]
    expected = bm25_lucene(docs, query, k1=k1)[:10]
    got = LiteratureIndex(fixture_index, exact=exact).search(query, 10)
    assert [p.id for p in got] == [papers[i]["id"] for _, i in expected]
    # the fixture's texts are short: tantivy's one-byte length code is exact there
    assert [p.score for p in got] == pytest.approx([s for s, _ in expected], rel=1e-4)
    assert all(p.source == "literature_index" for p in got)


def test_exact_rescoring_returns_bm25s_hits_in_bm25s_order_where_the_engine_alone_does_not(tmp_path):
    """Issue 41 point 4 on the demo slice's real SciFact abstracts (longer than tantivy's exact length codes): every
    query's 21 hits are bm25s' own, in its order, with its scores; the engine's own ranking (k1 1.2, coded lengths)
    is not, which is what the rescoring is for."""
    tiny = ROOT / "data" / "demo" / "scifact-tiny"
    build_index([tiny], tmp_path / "idx", progress=False)
    bm25s_source = LocalCorpus(tiny, index_dir=tmp_path / "bm25")
    exact, engine = LiteratureIndex(tmp_path / "idx"), LiteratureIndex(tmp_path / "idx", exact=False)
    queries = [r["text"] for r in read_jsonl(tiny / "queries.jsonl")]
    queries += [f"{p.title} {p.abstract}"[:160] for p in bm25s_source.papers[:40]]  # 05-like: long, many terms
    engine_differs = 0
    for query in queries:
        want = bm25s_source.search(query, 21)
        got = exact.search_many([query], 21, threads=2)[0]
        assert [h.id for h in got] == [h.id for h in want], query
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-4), query
        engine_differs += [h.id for h in engine.search(query, 21)] != [h.id for h in want]
    assert engine_differs > 0


def test_beir_folder_min_score_and_ties(tmp_path):
    rows = [{"_id": "d0", "title": "alpha beta", "text": "gamma"},
            {"_id": "d1", "title": "alpha beta", "text": "gamma"}, {"_id": "d2", "title": "delta", "text": "alpha"},
            {"_id": "d3", "title": "", "text": "epsilon zeta"},
            {"_id": "d4", "title": "alpha beta", "text": "gamma"}]
    write_jsonl_gz(tmp_path / "beir" / "corpus.jsonl.gz", rows)
    stats = build_index([tmp_path / "beir"], tmp_path / "idx", progress=False)
    assert (stats["papers"], stats["added"]) == (5, 5)
    index = LiteratureIndex(tmp_path / "idx")
    hits = index.search("alpha beta gamma", 10)
    assert [h.id for h in hits] == ["d0", "d1", "d4", "d2"]  # equal scores: corpus order, as LocalCorpus
    assert index.search("the of and", 5) == [] and index.search("unknownword", 5) == []
    assert [h.id for h in index.search("alpha beta gamma", 2)] == ["d0", "d1"]
    strict = LiteratureIndex(tmp_path / "idx", min_score=hits[-1].score + 1e-6)  # d2 matches one word only
    assert [h.id for h in strict.search("alpha beta gamma", 10)] == ["d0", "d1", "d4"]


def test_jsonl_unicode_missing_title_and_a_50mb_abstract(tmp_path):
    huge = "graphene " * (50 * 1024 * 1024 // 9)  # ~50 MB in one line
    rows = [{"id": "u1", "title": "Größe der Übergangsmetalle", "abstract": "Ionenradien von Übergangsmetallen, "
             "gemessen mit Röntgenbeugung. 日本語 テキスト"},
            {"id": "u2", "abstract": "A paper with no title about perovskite ferroelectrics."},
            {"id": "u3", "title": "Lone surrogate \ud800 in a title", "abstract": "surrogate handling"},
            {"id": "u4", "title": "Huge abstract", "abstract": huge},
            {"id": "u5", "title": "", "abstract": ""}]
    path = tmp_path / "papers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    stats = build_index([path], tmp_path / "idx", progress=False)
    assert (stats["papers"], stats["skipped"]) == (4, 1)  # u5 has neither title nor abstract
    index = LiteratureIndex(tmp_path / "idx")
    assert [h.id for h in index.search("übergangsmetalle größe", 3)] == ["u1"]
    assert [h.id for h in index.search("日本語", 3)] == ["u1"]
    notitle = index.search("perovskite ferroelectrics", 3)
    assert [h.id for h in notitle] == ["u2"] and notitle[0].title == ""
    assert index.search("surrogate", 3)[0].title == "Lone surrogate \ufffd in a title"
    big = index.search("graphene", 3)
    assert [h.id for h in big] == ["u4"] and len(big[0].abstract) == MAX_TEXT_CHARS  # cut


def test_s2_papers_and_abstracts_shards_joined_on_corpusid(tmp_path):
    release = tmp_path / "2025-01-01"
    write_jsonl_gz(release / "papers" / "papers-part0.gz", [
        {"corpusid": 11, "title": "Graphene mobility under pressure", "externalids": {"DOI": "10.1/g", "MAG": "5"},
         "year": 2020, "venue": "Nano Lett.", "url": "https://s2/11", "authors": []},
        {"corpusid": 12, "title": "Venetoclax in CLL", "externalids": {"DOI": None}, "year": None, "venue": ""},
        {"corpusid": 13, "title": None, "externalids": None, "year": 2019, "venue": "J"}])
    write_jsonl_gz(release / "papers" / "papers-part1.gz", [
        {"corpusid": 14, "title": "Perovskite solar cells", "externalids": {}, "year": 2021, "venue": "Joule"}])
    write_jsonl_gz(release / "abstracts" / "abstracts-part0.gz", [
        {"corpusid": 11, "abstract": "Hall mobility of monolayer graphene in a diamond anvil cell.",
         "openaccessinfo": {"license": None}},
        {"corpusid": 13, "abstract": "An untitled paper on lithium dendrites."},
        {"corpusid": 99, "abstract": "An abstract whose paper is not in the release."}])
    write_jsonl_gz(release / "abstracts" / "abstracts-part1.gz", [{"corpusid": 14, "abstract": None}])
    stats = build_index([release], tmp_path / "idx", progress=False)
    assert (stats["papers"], stats["abstracts_loaded"], stats["papers_without_abstract"]) == (4, 3, 2)
    index = LiteratureIndex(tmp_path / "idx")
    g = index.search("graphene diamond anvil", 5)
    assert [h.id for h in g] == ["11"]
    assert (g[0].doi, g[0].year, g[0].venue, g[0].url) == ("10.1/g", 2020, "Nano Lett.", "https://s2/11")
    assert "diamond anvil" in g[0].abstract
    v = index.search("venetoclax", 5)[0]  # no abstract in the release: found by its title
    assert (v.id, v.abstract, v.doi, v.year, v.venue) == ("12", "", None, None, None)
    assert [(h.id, h.title) for h in index.search("lithium dendrites", 5)] == [("13", "")]
    assert index.search("release", 5) == []  # corpusid 99: an abstract without a paper is not indexed
    kinds = sorted(e["kind"] for e in read_json(tmp_path / "idx" / MANIFEST)["inputs"])
    assert kinds == ["s2_abstracts", "s2_abstracts", "s2_papers", "s2_papers"]
    late = write_jsonl_gz(tmp_path / "late-abstracts.gz", [{"corpusid": 12, "abstract": "BCL-2 inhibition."}])
    with pytest.raises(DataError, match="abstracts shard added after papers shards"):
        build_index([release, late], tmp_path / "idx", progress=False)


def _corpus_files(tmp_path: Path) -> list[Path]:
    papers = read_jsonl(PAPERS)
    files = []
    for i in range(3):
        files.append(tmp_path / f"part{i}.jsonl")
        files[-1].write_text("".join(json.dumps(p) + "\n" for p in papers[i * 10:(i + 1) * 10]), encoding="utf-8")
    return files


QUERIES = ["graphene mobility pressure", "BCL-2 venetoclax apoptosis", "mantle cell lymphoma", "perovskite", "T cells"]


def _results(folder: Path) -> list[list[tuple[str, float]]]:
    index = LiteratureIndex(folder)
    return [[(h.id, round(h.score, 5)) for h in hits] for hits in index.search_many(QUERIES, 10, threads=2)]


def test_killed_build_resumes_equal_and_a_rebuild_does_nothing(tmp_path):
    files = _corpus_files(tmp_path)
    full = build_index(files, tmp_path / "full", progress=False)
    cmd = [*CLI, "build", *map(str, files), "--index", str(tmp_path / "killed"), "--no_progress"]
    killed = subprocess.run(cmd, env={**ENV, "REPAIR_LITERATURE_TEST_CRASH_AFTER": "15"}, capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == 17  # died in the second file after 5 of its papers: the first file is committed
    manifest = read_json(tmp_path / "killed" / MANIFEST)
    assert (manifest["papers"], len(manifest["inputs"]), manifest["complete"]) == (10, 1, False)
    with pytest.raises(LiteratureIndexError, match="did not finish"):
        LiteratureIndex(tmp_path / "killed")
    resumed = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["papers"] == full["papers"] == 30
    assert _results(tmp_path / "killed") == _results(tmp_path / "full")
    again = build_index(files, tmp_path / "killed", progress=False)
    assert (again["added"], again["inputs_done_before"], again["papers"]) == (0, 3, 30)
    # killed after a file's commit but before the manifest recorded it: the commit is recognised, not redone
    manifest = read_json(tmp_path / "full" / MANIFEST)
    last = manifest["inputs"].pop()
    manifest.update(papers=manifest["papers"] - last["papers"], complete=False,
                    pending={"docs_before": manifest["papers"] - last["papers"], "entry": last})
    write_json(tmp_path / "full" / MANIFEST, manifest)
    healed = build_index(files, tmp_path / "full", progress=False)
    assert (healed["added"], healed["papers"]) == (0, 30)
    assert _results(tmp_path / "full") == _results(tmp_path / "killed")
    files[0].write_text(files[0].read_text().replace("graphene", "graphite"), encoding="utf-8")
    with pytest.raises(DataError, match="changed since it was indexed"):
        build_index(files, tmp_path / "full", progress=False)


def _refusal(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "search", "graphene", "--index", str(folder)], env=ENV, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("damage", ["no_index", "manifest_json", "analyzer", "engine_format", "meta", "segment"])
def test_corrupt_or_mismatching_index_refused_in_one_line(fixture_index, tmp_path, damage):
    folder = tmp_path / "idx"
    shutil.copytree(fixture_index, folder)
    manifest = read_json(folder / MANIFEST)
    expected = {"no_index": "not a literature index", "manifest_json": "corrupt index manifest",
                "analyzer": "built with another analyzer (differs in stopwords)",
                "engine_format": "index format 6", "meta": "cannot be opened", "segment": "damaged"}[damage]
    if damage == "no_index":
        (folder / MANIFEST).unlink()
    elif damage == "manifest_json":
        (folder / MANIFEST).write_text('{"format": ', encoding="utf-8")
    elif damage == "analyzer":
        manifest["analyzer"]["stopwords"] = manifest["analyzer"]["stopwords"][:-1]
        write_json(folder / MANIFEST, manifest)
    elif damage == "engine_format":
        manifest["engine"]["index_format"] = 6
        write_json(folder / MANIFEST, manifest)
    elif damage == "meta":
        (folder / "tantivy" / "meta.json").write_text("{not json", encoding="utf-8")
    else:  # a segment's files gone: the engine cannot open it
        for f in (folder / "tantivy").glob("*.idx"):
            f.unlink()
        expected = "cannot be opened"
    out = _refusal(folder)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], out.stderr


def test_two_processes_search_one_read_only_index_at_once(fixture_index, tmp_path):
    folder = tmp_path / "idx"
    shutil.copytree(fixture_index, folder)
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)  # read-only: opening must not write
    try:
        script = ("import json,sys; from repair.expansion.sources.literature_search import LiteratureIndex as L; "
                  "i=L(sys.argv[1]); print(json.dumps([[h.id for h in hs] for hs in "
                  "i.search_many(['graphene mobility','venetoclax','perovskite']*200, 5, threads=2)]))")
        procs = [subprocess.Popen([sys.executable, "-c", script, str(folder)], env=ENV, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in [folder, *folder.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    first, second = (json.loads(o) for o, _ in outs)
    assert first == second and len(first) == 600
    expected = [[h.id for h in LocalCorpus(PAPERS, index_dir=tmp_path / "bm25").search(q, 5)]
                for q in ["graphene mobility", "venetoclax", "perovskite"]]
    assert [hits[:1] for hits in first[:3]] == [e[:1] for e in expected]


def test_06_verifies_the_same_through_the_index_as_through_bm25s(fixture_index, tmp_path):
    generated = FIXTURES / "generated.jsonl"
    via_bm25s = make_source("local_corpus", corpus=str(PAPERS), index_dir=str(tmp_path / "bm25"))
    via_index = make_source("local_corpus", corpus=str(fixture_index))
    assert isinstance(via_index, LiteratureIndex)
    s1 = run_verification(via_bm25s, generated, tmp_path / "a.jsonl", target_k=5, progress=False)
    s2 = run_verification(via_index, generated, tmp_path / "b.jsonl", target_k=5, progress=False, workers=2)
    assert s1.counts == s2.counts and s1.counts["ok"] > 0

    def comparable(path: Path) -> list[dict]:  # the source's name differs by design
        return [{k: v for k, v in r.items() if k not in ("source", "pos_score")} for r in read_jsonl(path)]

    assert comparable(tmp_path / "a.jsonl") == comparable(tmp_path / "b.jsonl")
    # exact rescoring: the positive's score is bm25s' own (rounded as 06 writes it)
    assert [float(r["pos_score"]) for r in read_jsonl(tmp_path / "b.jsonl")] == pytest.approx(
        [float(r["pos_score"]) for r in read_jsonl(tmp_path / "a.jsonl")], abs=2e-4)
    assert {r["source"] for r in read_jsonl(tmp_path / "b.jsonl")} == {"literature_index"}
    with pytest.raises(ValueError, match="--index_dir is the bm25s cache"):
        make_source("local_corpus", corpus=str(fixture_index), index_dir=str(tmp_path / "x"))


def test_driver_passes_literature_index_to_06_and_checks_it(fixture_index, tmp_path):
    from repair.driver.expansion_rounds import ExpansionRounds
    from repair.driver.settings import resolve, validate

    stage = ExpansionRounds(iteration="iter1", concept_txt=tmp_path / "c.txt", generated_jsonl=tmp_path / "g.jsonl",
                            out_jsonl=tmp_path / "e.jsonl", gen_round=4, max_rounds=1, target_valid=4, target_k=5,
                            seed=1, grounding="none", query_form="title", source="local", local_corpus=str(PAPERS),
                            literature_index=str(fixture_index))
    cmd = stage.verify_command("python", Path("expansion"))
    assert cmd[cmd.index("--corpus") + 1] == str(fixture_index)

    def problems(env: dict) -> list[str]:
        env = {"TRAIN_DATA": str(ROOT / "data/demo/scifact-demo"), **env}
        return validate(resolve(env, ROOT), env, check_installed=False)

    assert not [p for p in problems({"LITERATURE_INDEX": str(fixture_index)}) if "LITERATURE_INDEX" in p]
    for env in ({"LITERATURE_INDEX": str(tmp_path)}, {"LITERATURE_INDEX": str(fixture_index), "SOURCE": "elsevier"}):
        assert any(p.startswith("LITERATURE_INDEX needs SOURCE=local and a built index") for p in problems(env))
