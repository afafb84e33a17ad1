"""The local-corpus source: BM25 over a fixture corpus (JSONL and BEIR layouts), checked against a brute-force
Lucene BM25 written here, its own-title retrieval, no-hit queries, the saved index, and bad input."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from repair.data import DataError
from repair.expansion.sources.local_corpus import LocalCorpus, _tokenize, load_papers

FIXTURES = Path(__file__).parent / "fixtures" / "expansion"
PAPERS = FIXTURES / "papers.jsonl"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> LocalCorpus:
    return LocalCorpus(PAPERS, index_dir=tmp_path_factory.mktemp("bm25") / "index")


def brute_force_bm25(docs: list[str], query: str, k1: float = 1.5, b: float = 0.75) -> list[tuple[float, int]]:
    """Lucene's BM25 from its definition (idf = ln(1 + (N - df + .5)/(df + .5)), tf / (tf + k1 (1 - b + b dl/avgdl)),
    Lucene 8+ drops the constant (k1 + 1) factor), over the same tokens: (score, doc index), score > 0, best first."""
    toks = _tokenize(docs, return_ids=False)
    n, avgdl = len(toks), sum(map(len, toks)) / len(toks)
    df = Counter(t for d in toks for t in set(d))
    out = []
    q = _tokenize([query], return_ids=False)[0]
    for i, d in enumerate(toks):
        tf = Counter(d)
        s = sum(math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf[t]
                / (tf[t] + k1 * (1 - b + b * len(d) / avgdl)) for t in set(q) if tf[t])
        if s > 0:
            out.append((s, i))
    return sorted(out, key=lambda t: (-t[0], t[1]))


@pytest.mark.parametrize("query", ["graphene mobility pressure", "BCL-2 venetoclax apoptosis", "mantle cell lymphoma",
                                   "perovskite", "T cells"])
def test_ranking_matches_brute_force_bm25(corpus, query):
    docs = [f"{p.title} {p.abstract}".strip() for p in corpus.papers]
    expected = brute_force_bm25(docs, query)[:10]
    got = corpus.search(query, 10)
    assert [p.id for p in got] == [corpus.papers[i].id for _, i in expected]
    assert [p.score for p in got] == pytest.approx([s for s, _ in expected], rel=1e-4)


def test_own_title_returns_the_paper(corpus):
    # p27 (title only) and p28 (a preprint copy of p01) share their words with another paper; every other
    # paper must come back first for its own title.
    for paper in corpus.papers:
        if paper.id in ("p27", "p28"):
            continue
        top = corpus.search(paper.title, 3)[0]
        assert top.id == paper.id, (paper.title, top.title)
        assert top.abstract == paper.abstract and top.source == "local_corpus"


def test_no_shared_term_means_no_hits(corpus):
    assert corpus.search("qwertyuiop zxcvbnm", 5) == []
    assert corpus.search("the of and", 5) == []  # stopwords only
    assert len(corpus.search("graphene", 100)) == 4  # k above the hit count: only scored papers


def test_index_is_saved_and_reloaded(tmp_path):
    first = LocalCorpus(PAPERS, index_dir=tmp_path / "idx")
    assert first.built and (tmp_path / "idx" / "params.index.json").exists()
    second = LocalCorpus(PAPERS, index_dir=tmp_path / "idx")
    assert not second.built
    assert [p.id for p in second.search("graphene oxide", 5)] == [p.id for p in first.search("graphene oxide", 5)]


def test_beir_folder_gz_corpus(tmp_path):
    folder = tmp_path / "beir"
    folder.mkdir()
    with gzip.open(folder / "corpus.jsonl.gz", "wt", encoding="utf-8") as fh:
        for line in PAPERS.read_text().splitlines():
            rec = json.loads(line)
            fh.write(json.dumps({"_id": rec["id"], "title": rec["title"], "text": rec["abstract"],
                                 "metadata": {}}) + "\n")
    beir = LocalCorpus(folder, index_dir=tmp_path / "idx")
    hit = beir.search("Ferroptosis is driven by lipid peroxidation", 1)[0]
    assert hit.id == "p30" and hit.abstract.startswith("Ferroptosis is an iron-dependent")


def test_bad_corpus_lines_name_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "title": "ok", "abstract": "fine"}\n{"title": "no id", "abstract": "x"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: missing field 'id'"):
        load_papers(bad)
    bad.write_text('{"id": "a", "title": ["not", "a", "string"], "abstract": "x"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1: field 'title'"):
        load_papers(bad)
    with pytest.raises(FileNotFoundError):
        LocalCorpus(tmp_path / "missing.jsonl")


def test_min_score_makes_verification_stricter(tmp_path):
    strict = LocalCorpus(PAPERS, index_dir=tmp_path / "idx", min_score=3.0)
    loose = LocalCorpus(PAPERS, index_dir=tmp_path / "idx")
    hits = loose.search("graphene oxide water", 10)
    assert [p.id for p in strict.search("graphene oxide water", 10)] == [p.id for p in hits if p.score >= 3.0]
    assert len(hits) > len(strict.search("graphene oxide water", 10))
