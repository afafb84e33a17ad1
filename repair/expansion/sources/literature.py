"""The literature on the user's own disk: an on-disk BM25 index (tantivy) built by one streaming pass, and the
verification source 06 searches in it (issue 41, DESIGN 7).

``build_index`` streams BEIR folders (``corpus.jsonl[.gz]``), ``{id, title, abstract}`` JSONL(.gz) and Semantic
Scholar Datasets release shards (``papers`` + ``abstracts``, gzipped JSONL joined on ``corpusid``; read by
:mod:`repair.expansion.sources.literature_inputs`) into ``<index>/tantivy``; no corpus is ever held in memory.
The S2 join loads the ``abstracts`` shards first into a disk-backed map (``<index>/s2_abstracts.sqlite``, one
transaction per shard) and looks each ``papers`` record's abstract up there: memory stays at sqlite's page cache
whatever the release size (10^8 abstracts), at the price of disk (the map holds the abstracts zlib-compressed;
delete it once no ``papers`` shard is left to add).
Resumable per input file: each file is one tantivy commit, and ``manifest.json`` records the commit it expects
(``pending``) before making it, so a killed build knows on restart whether that file's commit landed (the
index's document count says) and redoes only the unfinished file. Building again with the same inputs does
nothing (an input is known by its sha256; path, size and mtime skip the hashing of unchanged files).

The verification source that searches it is :class:`repair.expansion.sources.literature_search.LiteratureIndex`
(read-only, memory-mapped, bm25s' scores); the analyzer below is bm25s' (same text, tokens and stop words).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from repair.data import DataError, file_sha256, write_json
from repair.expansion.sources.literature_format import (ABSTRACTS_DB, ENGINE_DIR, MANIFEST, LiteratureIndexError,
                                                        check_compatible, new_manifest, num_docs, open_engine,
                                                        paper_text, read_manifest)
from repair.expansion.sources.literature_inputs import (S2_ABSTRACTS, S2_PAPERS, AbstractsMap, Input,
                                                        expand_inputs, input_kind, iter_jsonl_papers, iter_s2_papers)
from repair.expansion.sources.literature_search import LiteratureIndex

logger = logging.getLogger(__name__)

HEAP_MB_PER_THREAD = 256  # tantivy's indexing buffer per thread (its minimum is ~15 MB)


# ------------------------------------------------------------------------------------------ build
def _identify(files: list[Path], manifest: dict) -> tuple[list[Input], list[Input]]:
    """(done, todo) inputs. A file is done when an input of the manifest has its path, size and mtime, or its
    sha256; a path indexed before whose content changed is an error (the index holds the old papers)."""
    by_path = {e["path"]: e for e in manifest["inputs"]}
    by_sha = {e["sha256"]: e for e in manifest["inputs"]}
    done, todo, seen = [], [], set()
    for path in files:
        inp = Input(path.resolve())
        entry = by_path.get(str(inp.path))
        size, mtime = inp.stat_key()
        if entry and (entry.get("size"), entry.get("mtime_ns")) == (size, mtime):
            inp.sha256, inp.kind = entry["sha256"], entry["kind"]
        else:
            inp.sha256 = file_sha256(inp.path)
            if entry and entry["sha256"] != inp.sha256:
                raise DataError(f"{inp.path}: changed since it was indexed into this index (sha256 "
                                f"{entry['sha256'][:12]}... -> {inp.sha256[:12]}...); build into a new --index folder")
        if inp.sha256 in seen:
            logger.info("%s: the same file as an earlier input (sha256); indexed once", inp.path)
            continue
        seen.add(inp.sha256)
        if inp.sha256 in by_sha:
            inp.kind = by_sha[inp.sha256]["kind"]
            done.append(inp)
        else:
            inp.kind = input_kind(inp.path)
            todo.append(inp)
    return done, todo


def _entry(inp: Input, papers: int, skipped: int = 0, **extra) -> dict:
    size, mtime = inp.stat_key()
    return {"path": str(inp.path), "kind": inp.kind, "sha256": inp.sha256, "size": size, "mtime_ns": mtime,
            "papers": papers, "skipped": skipped, **extra}


def _reconcile(index_dir: Path, manifest: dict, index) -> None:
    """After a killed build: whether the pending file's commit landed (the document count says so)."""
    count = num_docs(index)
    pending = manifest.get("pending")
    if pending and count == pending["docs_before"] + pending["entry"]["papers"] and pending["entry"]["papers"]:
        manifest["inputs"].append(pending["entry"])
        manifest["papers"] = count
        logger.info("%s: the last build committed %s before it stopped; kept", index_dir, pending["entry"]["path"])
    elif count != manifest["papers"]:
        raise LiteratureIndexError(f"{index_dir}: the index holds {count} papers, its manifest says "
                                   f"{manifest['papers']}; the index is damaged: rebuild it into a new folder")
    manifest["pending"] = None


def build_index(inputs: list[str | Path], index_dir: str | Path, *, threads: int = 1, progress: bool = True,
                heap_mb: int | None = None) -> dict:
    """Stream ``inputs`` (BEIR folders, ``{id, title, abstract}`` JSONL, S2 ``papers``/``abstracts`` shards or
    folders of them) into the index at ``index_dir``; return the build's statistics (``papers``: in the index,
    ``added``: by this call, ``seconds`` ...).

    One tantivy commit per input file, recorded in the manifest (see the module docstring): a killed build resumes
    at the unfinished file and ends equal to an uninterrupted one; the same inputs again do nothing. ``threads``
    are tantivy's indexing threads (the JSON parsing stays on this one); ``heap_mb`` its buffer (default
    :data:`HEAP_MB_PER_THREAD` per thread)."""
    from tqdm import tqdm

    t0 = time.time()
    index_dir = Path(index_dir).expanduser()
    files = expand_inputs(inputs)
    if (index_dir / MANIFEST).exists():
        manifest = read_manifest(index_dir)
        check_compatible(manifest, index_dir)
    elif index_dir.exists() and any(index_dir.iterdir()):
        raise LiteratureIndexError(f"{index_dir}: the folder exists and holds no literature index ({MANIFEST}); "
                                   "choose an empty or new --index folder")
    else:
        index_dir.mkdir(parents=True, exist_ok=True)
        manifest = new_manifest()
        write_json(index_dir / MANIFEST, manifest)
    if (index_dir / ENGINE_DIR / "meta.json").exists():  # a killed build: did its last commit land?
        _reconcile(index_dir, manifest, open_engine(index_dir / ENGINE_DIR, create=False))
        write_json(index_dir / MANIFEST, manifest)
    done, todo = _identify(files, manifest)
    stats = {"index": str(index_dir), "inputs": len(done) + len(todo), "inputs_done_before": len(done), "added": 0,
             "skipped": 0, "abstracts_loaded": 0, "papers_without_abstract": 0}
    if not todo and not manifest.get("pending") and manifest.get("complete"):
        logger.info("%s: all %d inputs are indexed already (%d papers); nothing to do", index_dir, len(done),
                    manifest["papers"])
        return {**stats, "papers": manifest["papers"], "seconds": round(time.time() - t0, 3),
                "index_bytes": _folder_bytes(index_dir)}
    index = open_engine(index_dir / ENGINE_DIR, create=True)
    try:
        writer = index.writer(heap_size=(heap_mb or HEAP_MB_PER_THREAD * max(1, threads)) * 1_000_000,
                              num_threads=max(1, threads))
    except ValueError as exc:  # another build holds the writer lock
        reason = " ".join(str(exc).split())[:200]
        raise LiteratureIndexError(f"{index_dir}: cannot write the index ({reason}); is another build running on "
                                   "it?") from None
    writer.garbage_collect_files()  # segments a killed build wrote and never committed
    manifest["complete"] = False
    write_json(index_dir / MANIFEST, manifest)
    done_kinds = {e["kind"] for e in manifest["inputs"]}

    abstracts_in = [i for i in todo if i.kind == S2_ABSTRACTS]
    papers_in = [i for i in todo if i.kind != S2_ABSTRACTS]
    amap = None
    if abstracts_in or S2_ABSTRACTS in done_kinds or any(i.kind == S2_PAPERS for i in papers_in):
        if abstracts_in and S2_PAPERS in done_kinds:
            raise DataError(f"{abstracts_in[0].path}: an S2 abstracts shard added after papers shards were indexed "
                            "(those papers would miss its abstracts); give every abstracts shard with the papers "
                            "shards, in a new --index folder")
        amap = AbstractsMap(index_dir / ABSTRACTS_DB)
    try:
        if abstracts_in:
            loaded = amap.loaded()
            bar = tqdm(desc="abstracts", unit="abstract", disable=not progress, dynamic_ncols=True)
            for inp in abstracts_in:
                n = loaded[inp.sha256][1] if inp.sha256 in loaded else amap.load(inp, bar)
                stats["abstracts_loaded"] += n
                manifest["inputs"].append(_entry(inp, 0, abstracts=n))
                write_json(index_dir / MANIFEST, manifest)
            bar.close()
        if any(i.kind == S2_PAPERS for i in papers_in) and S2_ABSTRACTS not in {e["kind"] for e in manifest["inputs"]}:
            logger.warning("S2 papers shards without any abstracts shard: their papers are indexed by title only")
        bar = tqdm(desc="index", unit="paper", disable=not progress, dynamic_ncols=True)
        for inp in papers_in:
            bar.set_postfix_str(inp.path.name, refresh=False)
            added, skipped, no_abstract = _index_file(writer, inp, manifest["papers"], amap, bar)
            entry = _entry(inp, added, skipped)
            manifest["pending"] = {"docs_before": manifest["papers"], "entry": entry}
            write_json(index_dir / MANIFEST, manifest)
            writer.commit()
            manifest["inputs"].append(entry)
            manifest["papers"] += added
            manifest["pending"] = None
            write_json(index_dir / MANIFEST, manifest)
            stats["added"] += added
            stats["skipped"] += skipped
            stats["papers_without_abstract"] += no_abstract
            if skipped:
                logger.warning("%s: %d records with neither title nor abstract skipped", inp.path, skipped)
        bar.close()
    finally:
        if amap is not None:
            amap.close()
    writer.wait_merging_threads()
    count = num_docs(index)
    if count != manifest["papers"]:
        raise LiteratureIndexError(f"{index_dir}: the index holds {count} papers after the build, its manifest says "
                          f"{manifest['papers']}; rebuild it into a new folder")
    manifest["complete"] = True
    write_json(index_dir / MANIFEST, manifest)
    seconds = time.time() - t0
    logger.info("%s: %d papers (%d added from %d files) in %.1f s", index_dir, count, stats["added"], len(todo),
                seconds)
    return {**stats, "papers": count, "seconds": round(seconds, 3), "index_bytes": _folder_bytes(index_dir)}


def _index_file(writer, inp: Input, ord0: int, amap: AbstractsMap | None, bar) -> tuple[int, int, int]:
    """Add one input's papers (``ord`` numbered from ``ord0``); (added, skipped, without abstract)."""
    import tantivy

    # tests only: die (uncommitted) once the index would hold that many papers, as a kill would
    crash_after = int(os.environ.get("REPAIR_LITERATURE_TEST_CRASH_AFTER", "0")) - ord0
    papers = iter_s2_papers(inp.path, amap) if inp.kind == S2_PAPERS else iter_jsonl_papers(inp.path)
    added = skipped = no_abstract = 0
    for paper in papers:
        if paper is None:
            skipped += 1
            continue
        doc = tantivy.Document()
        doc.add_text("text", paper_text(paper))
        doc.add_bytes("paper", json.dumps(paper, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        doc.add_unsigned("ord", ord0 + added)
        writer.add_document(doc)
        added += 1
        no_abstract += not paper["abstract"]
        if added % 1024 == 0:
            bar.update(1024)
        if added == crash_after:
            os._exit(17)
    bar.update(added % 1024)
    return added, skipped, no_abstract


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    from repair.cli import positive_int
    from repair.runtime import setup_logging

    p = argparse.ArgumentParser(prog="python -m repair.expansion.sources.literature",
                                description="Build or query an on-disk literature index (tantivy BM25) for 06's "
                                            "verification (issue 41). Build: streams its inputs, resumable per input "
                                            "file, idempotent.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="stream corpora into an index (resumes a killed build; same inputs: no-op)")
    b.add_argument("inputs", nargs="+", help="BEIR folders (corpus.jsonl[.gz]), {id, title, abstract} JSONL(.gz), "
                                             "Semantic Scholar Datasets papers/abstracts shards or folders of them")
    b.add_argument("--index", required=True, help="the index folder (created; an existing index is extended)")
    b.add_argument("--threads", type=positive_int, default=1, help="tantivy indexing threads (default: %(default)s)")
    b.add_argument("--heap_mb", type=positive_int, default=None,
                   help=f"tantivy's indexing buffer in MB (default: {HEAP_MB_PER_THREAD} per thread)")
    b.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    s = sub.add_parser("search", help="print the top hits of each query")
    s.add_argument("queries", nargs="+", help="query texts")
    s.add_argument("--index", required=True, help="the index folder")
    s.add_argument("--k", type=positive_int, default=5, help="hits per query (default: %(default)s)")
    i = sub.add_parser("info", help="print the index's manifest (what built it)")
    i.add_argument("--index", required=True, help="the index folder")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    if args.command == "build":
        stats = build_index(args.inputs, args.index, threads=args.threads, progress=not args.no_progress,
                            heap_mb=args.heap_mb)
        print(json.dumps(stats))
    elif args.command == "search":
        index = LiteratureIndex(args.index)
        for query, hits in zip(args.queries, index.search_many(args.queries, args.k)):
            print(f"# {query}")
            for rank, hit in enumerate(hits, 1):
                print(f"{rank}\t{hit.score:.4f}\t{hit.id}\t{hit.title[:100]}")
    else:
        manifest = read_manifest(args.index)
        check_compatible(manifest, args.index)
        print(json.dumps({k: manifest[k] for k in ("format", "engine", "papers", "complete", "bm25")} |
                         {"inputs": len(manifest["inputs"])}, indent=1))
    return 0


if __name__ == "__main__":
    from repair.cli import run_script

    run_script(main)
