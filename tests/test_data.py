"""Loaders and writers: every seed format, key fallbacks, dropped rows, errors that name file/line/field."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from repair.data import (DataError, JsonlAppender, file_sha256, iter_appended_jsonl, iter_jsonl, load_beir, load_seed,
                         read_json, read_jsonl, write_json, write_jsonl)


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def make_beir(folder, gz=False):
    (folder / "qrels").mkdir(parents=True)
    corpus = [{"_id": "d1", "title": "Alpha", "text": "alpha text"},
              {"_id": "d2", "title": "", "text": "beta text"},
              {"_id": "d3", "title": "Gamma", "text": "gamma text"}]
    queries = [{"_id": "q1", "text": "first query"}, {"_id": "q2", "text": "second query"},
               {"_id": "q3", "text": "test only query"}]
    payload = "".join(json.dumps(c) + "\n" for c in corpus)
    if gz:
        with gzip.open(folder / "corpus.jsonl.gz", "wt") as fh:
            fh.write(payload)
    else:
        (folder / "corpus.jsonl").write_text(payload)
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td3\t1\nq2\td2\t1\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq3\td3\t2\n")
    return folder


def test_seed_pt_with_key_fallbacks_and_dropped(tmp_path):
    rows = [
        {"paper_Title": "T1", "paper_abstract": "A1"},
        {"query": "T2", "passage": "A2"},
        {"question": "T3", "positive": "A3"},
        {"paper_Title": "T4", "abstract": "A4"},
        {"title": "ignored", "query": "T5", "text": "A5"},
        {"paper_Title": "  ", "paper_abstract": "A6"},          # empty query: dropped
        {"paper_Title": "T7", "paper_abstract": ""},            # empty passage: dropped
        {"paper_Title": "T8", "paper_abstract": "", "text": "A8"},  # falls back past an empty primary key
    ]
    torch.save(rows, tmp_path / "t0.pt")
    seed = load_seed(tmp_path / "t0.pt")
    assert seed.queries == ["T1", "T2", "T3", "T4", "T5", "T8"]
    assert seed.passages == ["A1", "A2", "A3", "A4", "A5", "A8"]
    assert seed.dropped == 2
    assert seed.kept_rows == [0, 1, 2, 3, 4, 7]
    torch.save({"data": rows[:2]}, tmp_path / "wrapped.pt")
    assert load_seed(tmp_path / "wrapped.pt").queries == ["T1", "T2"]


def test_seed_pt_refuses_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save([Evil()], tmp_path / "evil.pt")
    with pytest.raises(DataError, match="weights_only=True"):
        load_seed(tmp_path / "evil.pt")


def test_torch_file_refused_by_weights_only_names_the_file_in_one_line(tmp_path):
    """torch's message is a paragraph about trusting the source; ours names the file and the reason."""
    import numpy as np

    from repair.data import load_torch_file

    torch.save({"reps": np.zeros(3)}, tmp_path / "cache.pt")
    with pytest.raises(DataError) as err:
        load_torch_file(tmp_path / "cache.pt")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'cache.pt'}: not loadable with torch.load(weights_only=True) "
                              f"(Unsupported global: GLOBAL numpy")
    assert "\n" not in message and "trust the source" not in message
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(DataError, match=r"junk\.pt: not loadable with torch\.load\(weights_only=True\) "
                                        r"\(Unsupported operand"):
        load_seed(tmp_path / "junk.pt")


def test_json_errors_read_well_and_undecodable_files_are_named(tmp_path):
    """json's "Unterminated string starting at" + " at column" printed "at at column"."""
    (tmp_path / "a.jsonl").write_text('{"query": "q", "positive": "p"}\n{"query": "open')
    with pytest.raises(DataError) as err:
        read_jsonl(tmp_path / "a.jsonl")
    assert str(err.value) == f"{tmp_path / 'a.jsonl'}:2: invalid JSON (Unterminated string starting at column 11)"
    (tmp_path / "m.json").write_text('{\n  "a": 1,\n  "b": "tab\there"\n}')
    with pytest.raises(DataError) as err:
        read_json(tmp_path / "m.json")
    assert str(err.value) == f"{tmp_path / 'm.json'}:3: invalid JSON (Invalid control character at column 12)"
    (tmp_path / "latin1.jsonl").write_bytes(b'{"query": "q", "positive": "p"}\n{"query": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl: not UTF-8 text \(invalid continuation byte"):
        read_jsonl(tmp_path / "latin1.jsonl")
    (tmp_path / "broken.jsonl.gz").write_bytes(b"plain text, not gzip")
    with pytest.raises(DataError, match=r"broken\.jsonl\.gz: not a readable gzip file"):
        read_jsonl(tmp_path / "broken.jsonl.gz")


def test_seed_jsonl(tmp_path):
    path = write_lines(tmp_path / "t0.jsonl", [
        json.dumps({"query": "q1", "positive": "p1"}),
        "",
        json.dumps({"query": "", "positive": "p2"}),
        json.dumps({"paper_Title": "q3", "paper_abstract": "p3"}),
    ])
    seed = load_seed(path)
    assert (seed.queries, seed.passages, seed.dropped) == (["q1", "q3"], ["p1", "p3"], 1)


@pytest.mark.parametrize("bad, message", [
    ('{"query": "q", "positive": "p"', r"t0\.jsonl:2: invalid JSON"),
    ('{"query": "q"}', r"t0\.jsonl:2: missing field 'positive'"),
    ('{"query": ["q"], "positive": "p"}', r"t0\.jsonl:2: field 'query' must be a string"),
    ('[1, 2]', r"t0\.jsonl:2: expected a JSON object"),
])
def test_seed_jsonl_errors_name_file_line_field(tmp_path, bad, message):
    path = write_lines(tmp_path / "t0.jsonl", [json.dumps({"query": "q", "positive": "p"}), bad])
    with pytest.raises(DataError, match=message):
        load_seed(path)


@pytest.mark.parametrize("gz", [False, True])
def test_beir_loader_and_seed(tmp_path, gz):
    folder = make_beir(tmp_path / "beir", gz=gz)
    test = load_beir(folder, "test")
    assert list(test.queries) == ["q3"] and test.qrels == {"q3": {"d3": 2}}
    assert test.doc_text("d1") == "Alpha alpha text" and test.doc_text("d2") == "beta text"
    seed = load_seed(folder, split="train")
    assert seed.queries == ["first query", "second query"]
    assert seed.passages == ["Alpha alpha text", "beta text"]
    assert seed.doc_ids == ["d1", "d2"]
    every = load_seed(folder, split="train", all_positives=True)
    assert every.queries == ["first query", "first query", "second query"]
    assert every.twins() == [[1], [0], []]


def test_beir_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="BEIR folder not found"):
        load_beir(tmp_path / "nope")
    (tmp_path / "b" / "qrels").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="test.tsv"):
        load_beir(tmp_path / "b")


def test_twins_cover_duplicate_passages_and_queries(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [json.dumps(r) for r in [
        {"query": "a", "positive": "P"}, {"query": "b", "positive": "P"}, {"query": "c", "positive": "Q"},
        {"query": "c", "positive": "R"}, {"query": "d", "positive": "S"}]])
    assert load_seed(path).twins() == [[1], [0], [3], [2], []]


def test_validating_reader_types(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [
        json.dumps({"query": "q", "hard_negatives": ["a", "b"], "hard_negative_scores": [1, 0.5]}),
        json.dumps({"query": "q", "hard_negatives": "a, b", "hard_negative_scores": [1]}),
    ])
    schema = {"query": str, "hard_negatives": list[str], "hard_negative_scores": list[float]}
    rows = iter_jsonl(path, required=schema)
    assert next(rows)["hard_negatives"] == ["a", "b"]
    with pytest.raises(DataError, match=r"x\.jsonl:2: field 'hard_negatives' must be list\[str\], got str"):
        next(rows)


def test_atomic_writers(tmp_path):
    out = tmp_path / "sub" / "rows.jsonl"
    assert write_jsonl(out, ({"i": i, "t": "é"} for i in range(3))) == 3
    assert read_jsonl(out, required={"i": int}) == [{"i": 0, "t": "é"}, {"i": 1, "t": "é"}, {"i": 2, "t": "é"}]

    def failing():
        yield {"i": 9}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_jsonl(out, failing())
    assert len(read_jsonl(out)) == 3  # the old complete file is untouched
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    write_json(tmp_path / "m.json", {"a": [1]})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": [1]}


def test_appender_cuts_partial_line_from_killed_writer(tmp_path):
    path = tmp_path / "out.jsonl"
    script = (
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from repair.data import JsonlAppender\n"
        f"a = JsonlAppender({str(path)!r})\n"
        "for i in range(3): a.append({'i': i})\n"
        f"fh = open({str(path)!r}, 'a'); fh.write('{{\"i\": 3, \"trunc'); fh.flush()\n"
        "os._exit(9)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], env=env)
    assert proc.returncode == 9
    with JsonlAppender(path) as app:
        app.append({"i": 3})
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2, 3]


def test_resume_readers_skip_a_partial_last_line_and_never_truncate(tmp_path):
    """What a killed (or still running) writer left: every resume reader skips the half line and leaves the file
    as it is (a reader may run while 06 appends); the appender cuts it when the stage resumes."""
    from repair.expansion.verification import count_valid, read_status

    whole = '{"id": "a", "status": "ok"}\n{"id": "b", "status": "no_hits"}\n'
    status = tmp_path / "exp.jsonl.status.jsonl"
    status.write_text(whole + '{"id": "c", "sta')
    out = tmp_path / "exp.jsonl"
    out.write_text('{"id": "a", "q_new": "q"}\n{"id": "b"')
    assert set(read_status(status)) == {"a", "b"} and count_valid(out) == 1
    assert status.read_text() == whole + '{"id": "c", "sta' and out.read_text().endswith('{"id": "b"')
    assert [n for n, _ in iter_appended_jsonl(status, with_lineno=True)] == [1, 2]
    assert list(iter_appended_jsonl(tmp_path / "not_written_yet.jsonl")) == []
    with JsonlAppender(status) as app:
        app.append({"id": "c", "status": "ok"})
    assert [r["id"] for r in iter_appended_jsonl(status)] == ["a", "b", "c"]
    status.write_text(whole.replace('"b"', "b"))  # a broken *whole* line is an error, not a partial one
    with pytest.raises(DataError, match=r"exp.jsonl.status.jsonl:2: invalid JSON"):
        read_status(status)


def test_file_sha256_streams_blocks_and_versions_with_a_prefix(tmp_path):
    data = os.urandom(3 * (1 << 20) + 17)  # more than one read block
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert file_sha256(path, prefix=b"bm25-v1") == hashlib.sha256(b"bm25-v1" + data).hexdigest()


def test_beir_slice_keeps_every_chosen_positive_and_is_seeded(tmp_path):
    """The study subsets and demo slices: answerable claims, T0 with one positive, same seed -> same folder."""
    from repair.evaluation.beir_slice import write_beir_slice

    src = tmp_path / "src"
    (src / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": f"T{i}", "text": f"text {i} \u03b2-catenin"} for i in range(40)]
    (src / "corpus.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    (src / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": f"claim {i}"}) + "\n"
                                               for i in range(12)))
    train_rows = "".join(f"q{i}\td{2 * i}\t1\nq{i}\td{2 * i + 1}\t1\n" for i in range(8))  # two positives each
    (src / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + train_rows)
    (src / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                            + "".join(f"q{i}\td{20 + i}\t1\n" for i in range(8, 12)) + "q11\td30\t1\n")
    train, test = load_beir(src, "train"), load_beir(src, "test")
    counts = write_beir_slice(train, test, tmp_path / "a", n_train=3, n_test=2, n_docs=10, seed=5)
    assert counts == {"train_claims": 3, "test_claims": 2, "corpus": 10}
    cut_train, cut_test = load_beir(tmp_path / "a", "train"), load_beir(tmp_path / "a", "test")
    assert len(cut_train.qrels) == 3 and len(cut_test.qrels) == 2
    for qid, positives in cut_train.qrels.items():
        assert list(positives) == [next(iter(train.qrels[qid]))]  # T0: the first positive only
    for qid, positives in cut_test.qrels.items():
        assert positives == test.qrels[qid]  # every positive of a test claim is kept...
    kept = {d for pos in [*cut_train.qrels.values(), *cut_test.qrels.values()] for d in pos}
    assert kept <= set(cut_train.corpus) and len(cut_train.corpus) == 10  # ...inside the corpus, padded to 10
    assert "\u03b2-catenin" in (tmp_path / "a" / "corpus.jsonl").read_text(encoding="utf-8")  # UTF-8, as all our JSONL
    assert not [p for p in (tmp_path / "a").rglob("*") if p.name.endswith(".tmp")]  # atomic writes left no temp file
    write_beir_slice(train, test, tmp_path / "b", n_train=3, n_test=2, n_docs=10, seed=5)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    write_beir_slice(train, test, tmp_path / "c", n_train=3, n_test=2, n_docs=10, seed=6)
    assert (tmp_path / "c" / "corpus.jsonl").read_text() != (tmp_path / "a" / "corpus.jsonl").read_text()
