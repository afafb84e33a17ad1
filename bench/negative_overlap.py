#!/usr/bin/env python
"""Do two negative sources pick the same documents for the same queries? (issue 16: lever 3's model-aware negatives
against BM25's, on the claims both cover.)

Reads two triplet JSONL files with the negative diagnostics' reader (``query``, ``pos_document``,
``hard_negatives``; the first of ``hard_negatives`` is the trained negative: Stage III's ``d_neg`` and 09b's first
mined one) and prints, over the queries of A that B also has: how often the trained negative is the same document,
how often A's trained negative is anywhere in B's list and B's in A's. Documents are compared by their
whitespace-normalised text, as that reader deduplicates them.

Example:
  python bench/negative_overlap.py runs/quality_84/repair/repair_conf_only_s1/iter1/differentiation/\\
final_train_data.bottom_30pct.jsonl runs/quality_84/data/scifact_train_bm25.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from repair.cli import fail
from repair.differentiation.causalneg.diagnostics import read_negative_sets
from repair.data import DataError


def _norm(text: str) -> str:
    return " ".join(text.split())


def read_negatives(path: str | Path) -> dict[str, list[str]]:
    """query -> its negatives in file order, the trained one first (repair.differentiation.causalneg.diagnostics' triplet reader)."""
    data = read_negative_sets([path])
    by_query: dict[str, list[str]] = {}
    for text, owner in zip(data.neg_texts, data.neg_owner):
        by_query.setdefault(_norm(data.queries[owner]), []).append(_norm(text))
    return by_query


def negative_overlap(a: dict[str, list[str]], b: dict[str, list[str]]) -> dict:
    """Counts over the queries in both: same trained negative, A's trained negative in B's list, B's in A's."""
    shared = [q for q in a if q in b]
    return {"queries_a": len(a), "queries_b": len(b), "shared_queries": len(shared),
            "same_trained_negative": sum(a[q][0] == b[q][0] for q in shared),
            "a_trained_in_b_list": sum(a[q][0] in b[q] for q in shared),
            "b_trained_in_a_list": sum(b[q][0] in a[q] for q in shared)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="triplet JSONL A (e.g. REPAIR's kept tuples)")
    p.add_argument("b", help="triplet JSONL B (e.g. the BM25 triplets of the same claims)")
    args = p.parse_args(argv)
    try:
        counts = negative_overlap(read_negatives(args.a), read_negatives(args.b))
    except (DataError, FileNotFoundError) as exc:
        fail(str(exc))
    n = max(counts["shared_queries"], 1)
    print(json.dumps(counts))
    print(f"{counts['shared_queries']} queries in both: same trained negative {counts['same_trained_negative']} "
          f"({counts['same_trained_negative'] / n:.0%}); A's in B's list {counts['a_trained_in_b_list']} "
          f"({counts['a_trained_in_b_list'] / n:.0%}); B's in A's list {counts['b_trained_in_a_list']} "
          f"({counts['b_trained_in_a_list'] / n:.0%})")
    return counts


if __name__ == "__main__":
    main()
