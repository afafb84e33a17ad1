"""The one command line behind ``expansion/06_semantic_scholar.py``, ``06_elsevier.py`` and ``06_local_corpus.py``.

The three scripts differ only in the source they build; flags follow the original README
(``--concept_txt --key_file --out_jsonl --target_k --resume``) plus the query-verification ones.
Exit status: 0; 1 when this run processed items and every one failed or was refused (the driver stops instead
of going on with nothing new; the failed ones are retried by ``--resume``); 2 on a fatal source error (bad key,
quota) or a user error.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from repair.cli import bounded_int, fail, non_negative_float, non_negative_int, positive_float, positive_int
from repair.expansion.concept_search import concept_groups_to_tuples, run_concept_mode
from repair.expansion.query_generation import read_concepts
from repair.runtime import setup_logging
from repair.expansion.sources import make_cache, make_source
from repair.expansion.sources.http import SourceError, load_keys
from repair.tables import text_table
from repair.expansion.verification import DEFAULT_QUERY_FORM, QUERY_FORMS, count_valid, run_verification, status_path_for

logger = logging.getLogger(__name__)

DEFAULT_TARGET_K = {"semantic_scholar": 20, "elsevier": 15, "local_corpus": 20}
KEY_ENVS = {"semantic_scholar": "S2_API_KEY", "elsevier": "ELSEVIER_API_KEY"}
URL_ENVS = {"semantic_scholar": "S2_API_URL", "elsevier": "ELSEVIER_API_URL"}


def build_parser(source: str) -> argparse.ArgumentParser:
    title = {"semantic_scholar": "Semantic Scholar Graph API (/paper/search)",
             "elsevier": "Elsevier Scopus Search (+ Abstract Retrieval)",
             "local_corpus": "a local corpus (BM25 over a BEIR folder or a JSONL of papers; no key, no network)",
             }[source]
    p = argparse.ArgumentParser(
        description=f"Stage II verification through {title}: each generated query (05 output) is searched; no "
                    "hits -> discarded; else top hit title = q_new, its abstract = d+, other hits = D-_cand. "
                    "--mode concept runs the original per-concept search instead.")
    p.add_argument("--mode", choices=["query", "concept"], default=None,
                   help="query: verify 05's generated queries (the paper); concept: search each concept string "
                        "and write one group line per concept (the original code). Default: query when "
                        "--generated_jsonl is given, concept when only --concept_txt is (the README command)")
    p.add_argument("--generated_jsonl", "--input_jsonl", dest="generated_jsonl", default=None,
                   help="05 output (generated queries JSONL); required in --mode query")
    p.add_argument("--concept_txt", default=None, help="C_conf, one concept per line (--mode concept)")
    p.add_argument("--out_jsonl", required=True,
                   help="expansion JSONL (appended one complete line at a time; verified tuples only)")
    p.add_argument("--status_jsonl", default=None,
                   help="per-item status log (default: <out_jsonl>.status.jsonl)")
    p.add_argument("--target_k", type=positive_int, default=DEFAULT_TARGET_K[source],
                   help="max negative candidates per tuple (query mode) / papers per concept (concept mode) "
                        "(default: %(default)s)")
    p.add_argument("--search_k", type=positive_int, default=None,
                   help="hits asked per query (default: target_k + 1: the positive and target_k others)")
    p.add_argument("--resume", action="store_true",
                   help="continue an existing --out_jsonl: skip done items (refused ones, a 4xx, included), "
                        "retry the failed ones")
    p.add_argument("--target_valid", type=positive_int, default=None,
                   help="stop once --out_jsonl holds this many valid tuples (the driver passes 2 x |T0|)")
    p.add_argument("--max_items", type=positive_int, default=None, help="process at most this many items this run")
    p.add_argument("--workers", type=non_negative_int, default=0,
                   help="parallel requests; 0 = one per API key (1 for a bm25s corpus, up to 4 threads for a "
                        "literature index); the output does not depend on it (verdicts are written in input order) "
                        "(default: %(default)s)")
    p.add_argument("--per_item_sleep", "--per_page_sleep", dest="per_item_sleep", type=non_negative_float, default=0.0,
                   help="extra pause in seconds after each item, on top of the rate limits (default: %(default)s)")
    p.add_argument("--allow_duplicate_positives", action="store_true",
                   help="keep a tuple whose positive paper was already verified for an earlier query")
    p.add_argument("--require_concept", action="store_true",
                   help="stricter than the paper: the positive must mention one of the query's concepts "
                        "(the top such hit with an abstract); else the query is discarded as off_concept")
    p.add_argument("--candidate_scores", action="store_true",
                   help="record each negative candidate's score from the source (the driver sets it with "
                        "HARD_TUPLES=1: 06e's lexical-tie guard reads it)")
    p.add_argument("--query_form", choices=QUERY_FORMS, default=DEFAULT_QUERY_FORM,
                   help="what q_new is (query mode): title = the verified top hit's title (the paper, whose T0 is "
                        "title -> abstract); generated = the generator's own query (top hit = positive), for a T0 "
                        "of claims or questions. T0-style rewriting is expansion/06c_t0_style_queries.py "
                        "(default: %(default)s)")
    p.add_argument("--tuples_jsonl", default=None,
                   help="--mode concept: also convert the groups into expansion tuples here (each paper with an "
                        "abstract = q_new/d+, the rest of its group = negative candidates)")
    p.add_argument("--count_only", action="store_true",
                   help="print the number of valid tuples in --out_jsonl and exit (for the 2 x |T0| loop)")
    if source == "local_corpus":
        p.add_argument("--corpus", default=os.environ.get("REPAIR_LOCAL_CORPUS"),
                       help="BEIR folder (corpus.jsonl[.gz]) or JSONL of {id, title, abstract} (BM25 in memory, "
                            "bm25s), or a literature index folder built by python -m "
                            "repair.expansion.sources.literature build (on disk, tantivy; any size; docs/expansion.md) "
                            "(default: $REPAIR_LOCAL_CORPUS)")
        p.add_argument("--index_dir", default=None,
                       help="where the BM25 index is saved/loaded (default: $REPAIR_CACHE/bm25/<corpus sha256>)")
        p.add_argument("--min_score", type=non_negative_float, default=0.0,
                       help="BM25 score a hit needs; 0 = any shared non-stopword term (default: %(default)s)")
    else:
        p.add_argument("--key_file", default=None,
                       help=f"API keys, one per line, '#' comments (default: ${KEY_ENVS[source]}, keys separated "
                            "by commas or newlines)")
        p.add_argument("--api_url", default=None, help=f"base URL (default: ${URL_ENVS[source]} or the public API)")
        p.add_argument("--rate", type=non_negative_float, default=None,
                       help="requests per second per key; 0 = no limit (a local mirror) (default: 1 for Semantic "
                            "Scholar, 9 for Elsevier)")
        p.add_argument("--timeout", type=positive_float, default=30.0,
                       help="seconds per request (default: %(default)s)")
        p.add_argument("--max_retries", type=non_negative_int, default=5,
                       help="retries on 429/5xx/timeouts, exponential backoff (default: %(default)s)")
        p.add_argument("--backoff", type=non_negative_float, default=1.0,
                       help="first backoff wait in seconds, doubled each retry (default: %(default)s)")
        p.add_argument("--cache_dir", default=None,
                       help="on-disk response cache (default: $REPAIR_CACHE/http; 'none' disables it)")
    if source == "semantic_scholar":
        p.add_argument("--page_limit", type=bounded_int(1, 100), default=100,
                       help="results per page, <= 100 (default: %(default)s)")
    if source == "elsevier":
        p.add_argument("--view", default="auto", choices=["auto", "COMPLETE", "STANDARD"],
                       help="Scopus view; auto = COMPLETE when entitled, else STANDARD + Abstract Retrieval "
                            "(default: %(default)s)")
        p.add_argument("--insttoken", default=None,
                       help="institutional token (prefer $ELSEVIER_INSTTOKEN: flags show up in process lists)")
        p.add_argument("--query_mode", default="keywords", choices=["keywords", "raw"],
                       help="keywords: TITLE-ABS-KEY over the query's content words (AND, then OR); raw: send the "
                            "text as Scopus query syntax (default: %(default)s)")
    p.add_argument("--log_level", default="INFO", help="logging level (default: %(default)s)")
    p.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    return p


def _source_from_args(source: str, args: argparse.Namespace):
    if source == "local_corpus":
        if not args.corpus:
            raise SystemExit("06_local_corpus: --corpus (or $REPAIR_LOCAL_CORPUS) is required")
        return make_source(source, corpus=args.corpus, index_dir=args.index_dir, min_score=args.min_score)
    return make_source(source, api_url=args.api_url, key_file=args.key_file, cache=make_cache(args.cache_dir),
                       timeout=args.timeout, rate=args.rate, max_retries=args.max_retries, backoff_base=args.backoff,
                       page_limit=getattr(args, "page_limit", 100), view=getattr(args, "view", "auto"),
                       insttoken=getattr(args, "insttoken", None), query_mode=getattr(args, "query_mode", "keywords"))


def _print_table(stats: dict) -> None:
    rows = [(k, v) for k, v in sorted(stats["processed"].items())]
    if stats.get("demoted_to_duplicate"):
        rows.append(("demoted to duplicate", stats["demoted_to_duplicate"]))
    rows += [("skipped (done before)", stats["skipped_done"]), ("valid tuples in file", stats["valid_total"])]
    print(text_table(rows, indent="  "), file=sys.stderr)


def verification_main(source: str, argv: list[str] | None = None) -> int:
    args = build_parser(source).parse_args(argv)
    setup_logging(args.log_level)
    if args.count_only:
        print(json.dumps({"out_jsonl": args.out_jsonl, "valid": count_valid(args.out_jsonl)}))
        return 0
    if args.mode is None:
        args.mode = "concept" if (args.concept_txt and not args.generated_jsonl) else "query"
    status_path = args.status_jsonl or status_path_for(args.out_jsonl)
    try:
        src = _source_from_args(source, args)
        workers = args.workers
        if workers <= 0 and source == "local_corpus":  # the index's engine searches in parallel (GIL released)
            workers = min(4, os.cpu_count() or 1) if src.name == "literature_index" else 1
        elif workers <= 0:
            workers = max(1, len(load_keys(args.key_file, KEY_ENVS[source])))
        if args.mode == "concept":
            if not args.concept_txt:
                raise SystemExit("--mode concept needs --concept_txt")
            if args.query_form != DEFAULT_QUERY_FORM:
                raise SystemExit(f"--query_form {args.query_form} applies to --mode query (concept mode has no "
                                 "generated query)")
            stats = run_concept_mode(src, read_concepts(args.concept_txt), args.out_jsonl, target_k=args.target_k,
                                     status_path=status_path, resume=args.resume, workers=workers,
                                     item_sleep=args.per_item_sleep, progress=not args.no_progress)
            if args.tuples_jsonl:
                n = concept_groups_to_tuples(args.out_jsonl, args.tuples_jsonl, args.target_k)
                logger.info("wrote %d tuples converted from the concept groups to %s", n, args.tuples_jsonl)
        else:
            if not args.generated_jsonl:
                raise SystemExit("--mode query needs --generated_jsonl (the 05 output)")
            stats = run_verification(src, args.generated_jsonl, args.out_jsonl, target_k=args.target_k,
                                     search_k=args.search_k, status_path=status_path, resume=args.resume,
                                     target_valid=args.target_valid, workers=workers, max_items=args.max_items,
                                     item_sleep=args.per_item_sleep,
                                     allow_duplicate_positives=args.allow_duplicate_positives,
                                     require_concept=args.require_concept, query_form=args.query_form,
                                     candidate_scores=args.candidate_scores, progress=not args.no_progress)
    except SourceError as exc:  # fatal: bad key / quota; the message names the service, never the key
        logger.error("%s", exc)
        print(json.dumps({"source": source, "mode": args.mode, "out_jsonl": args.out_jsonl, "error": str(exc),
                          "valid": count_valid(args.out_jsonl)}))
        return 2
    summary = {"source": source, "mode": args.mode, "out_jsonl": args.out_jsonl, **stats.as_dict()}
    _print_table(summary)
    print(json.dumps(summary))
    all_failed = stats.all_failed()
    if all_failed:  # the driver must stop here, not go on as if the source had answered
        sys.stdout.flush()
        fail(all_failed, code=1)
    return 0
