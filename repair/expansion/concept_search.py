"""06 ``--mode concept``, the original code's verification: search each concept string, keep all its hits.

Every concept of C_conf is searched and its hits are written as one group line ``{concept, got_k, papers}``
(:func:`run_concept_mode`); :func:`concept_groups_to_tuples` turns such a file into expansion tuples, the way the
original's steps 7-9 used the groups. Separate from :mod:`repair.expansion.verification` (the paper's query mode) because
it verifies no generated query; it shares that module's worker loop and status file, so both modes retry, refuse
and stop on a bad key the same way.
"""

from __future__ import annotations

import time
from pathlib import Path

from repair.data import JsonlAppender, iter_appended_jsonl, iter_jsonl, write_jsonl
from repair.expansion.sources.base import LiteratureSource, Paper, cap_query
from repair.expansion.verification import VerificationStats, check_new_outputs, read_status, status_path_for, verify_items


def _paper_line(p: Paper) -> dict:
    return {"pid": p.id, "doi": p.doi, "title": p.title, "abstract": p.abstract, "year": p.year, "venue": p.venue,
            "url": p.url, "source": p.source}


def run_concept_mode(source: LiteratureSource, concepts: list[str], out_jsonl: str | Path, *, target_k: int = 20,
                     status_path: str | Path | None = None, resume: bool = False, workers: int = 1,
                     item_sleep: float = 0.0, progress: bool = True) -> VerificationStats:
    """The original 06: search each concept string, write ``{concept, got_k, papers, elapsed_sec}`` per concept.

    Up to ``2 * target_k`` hits are asked, sorted abstract-first, then cut to ``target_k`` (the original asked
    up to 1000 and did the same, UPSTREAM 2.7). Unlike the
    original, a failed request is not written as ``got_k: 0``: it goes to the status file and is retried on
    ``--resume`` (a ``refused`` one, a 4xx, is not). Lines are written in the concept list's order.
    """
    out_jsonl = Path(out_jsonl)
    status_path = Path(status_path) if status_path else status_path_for(out_jsonl)
    check_new_outputs(out_jsonl, status_path, resume)
    written = {rec["concept"].lower() for rec in iter_appended_jsonl(out_jsonl, required={"concept": str})}
    refused = {c.lower() for c, st in read_status(status_path).items() if st["status"] == "refused"}
    todo = [c for c in concepts if c.lower() not in written | refused]
    stats = VerificationStats(valid_before=len(written), skipped_done=len(concepts) - len(todo))

    def search(concept: str) -> tuple[list[Paper], float]:
        start = time.time()
        hits = source.search(cap_query(concept), 2 * target_k)  # spare hits, so abstract-less ones go last
        if item_sleep:
            time.sleep(item_sleep)
        return hits, time.time() - start

    def take(concept: str, result: tuple[list[Paper], float]) -> bool:
        hits, elapsed = result
        papers = sorted(hits, key=lambda p: 0 if p.abstract else 1)[:target_k]
        out.append({"concept": concept, "got_k": len(papers), "papers": [_paper_line(p) for p in papers],
                    "elapsed_sec": round(elapsed, 3)})
        status = "ok" if papers else "no_hits"
        stats.counts[status] += 1
        status_log.append({"id": concept, "status": status, "n_hits": len(papers)})
        return False

    t0 = time.time()
    with JsonlAppender(out_jsonl) as out, JsonlAppender(status_path) as status_log:
        fatal = verify_items(todo, search, str, take, workers=workers, status_log=status_log, stats=stats,
                              desc=f"06 concepts ({source.name})", unit="concept", progress=progress, stamp=False)
    stats.valid_total = len(written) + stats.counts["ok"]
    stats.seconds = time.time() - t0
    if fatal is not None:
        raise fatal
    return stats


def concept_groups_to_tuples(concept_jsonl: str | Path, out_jsonl: str | Path, target_k: int = 20) -> int:
    """Convert a ``--mode concept`` file into expansion tuples, as the original's steps 7-9 used the groups:
    every paper with a title and an abstract is a (q_new = title, d+ = abstract) pair, the other papers of
    its concept group are its negative candidates. Ids are ``c{line}-{j}``. Returns the number written."""
    rows = []
    for lineno, rec in enumerate(iter_jsonl(concept_jsonl, required={"concept": str, "papers": list}), start=1):
        papers = [p for p in rec["papers"] if isinstance(p, dict) and (p.get("title") or "").strip()
                  and (p.get("abstract") or "").strip()]
        for j, p in enumerate(papers):
            negatives = [{"id": str(o.get("pid") or ""), "doi": o.get("doi"), "title": o["title"],
                          "abstract": o["abstract"]}
                         for o in papers if o is not p and o["abstract"] != p["abstract"]][:target_k]
            rows.append({"id": f"c{lineno}-{j}", "q_model": rec["concept"], "concepts": [rec["concept"]],
                         "q_new": p["title"].strip(), "d_pos": p["abstract"].strip(),
                         "pos_meta": {"id": str(p.get("pid") or ""), "doi": p.get("doi"), "title": p["title"],
                                      "year": p.get("year"), "venue": p.get("venue"), "url": p.get("url")},
                         "negative_candidates": negatives, "source": p.get("source") or "unknown"})
    return write_jsonl(out_jsonl, rows)


