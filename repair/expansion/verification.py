"""Stage II step 06, verification in a literature source (DESIGN 5 step 6): the rule, the one worker loop, the
status files.

Query mode (:func:`run_verification`, the paper): each generated query is searched. No hits: discarded. Otherwise
the best hit with an abstract gives q_new (its title) and d+ (its abstract), the other hits with an abstract (up to
``target_k``) are D-_cand (:func:`verify_hits`). One complete output line per verified query, a status line per
processed query (``ok | no_hits | no_abstract | duplicate | off_concept | refused | failed``); ``--resume`` skips
everything but ``failed``. The output is a function of the inputs only (issue 18): searches run in parallel but
verdicts are decided and written in the generated file's order, a positive counts as a ``duplicate`` only against
queries *before* it in that order, and a run that resumed failed items rewrites the output in input order, so any
number of keys, 429s, failures and resumes gives the same bytes. The driver repeats 05 -> 06 until
:func:`count_valid` reaches 2 x |T0| (:mod:`repair.driver.expansion_rounds`).

What q_new is (issue 16, ``QUERY_FORM``): the top hit's title (default, the paper, whose T0 is title -> abstract) or
the generated query itself (``query_form="generated"``); a T0-style rewrite comes after 06 (:mod:`repair.expansion.t0_style`).
06 exits non-zero when every item of a run failed (:meth:`VerificationStats.all_failed`).

Concept mode (the original code's 06, :mod:`repair.expansion.concept_search`) runs on the same worker loop
(:func:`verify_items`: searches ahead in parallel, results in input order, fatal / refused / failed handling and
their status lines), so a fix to one mode is a fix to both.

Separate from 05 (:mod:`repair.expansion.query_generation`): 06 needs a source, never a generator.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Container, Iterable

from repair.data import DataError, JsonlAppender, iter_appended_jsonl, iter_jsonl, write_jsonl
from repair.expansion.query_generation import GENERATED_OPTIONAL, GENERATED_REQUIRED, generation_summary
from repair.expansion.sources.base import LiteratureSource, Paper, cap_query
from repair.expansion.sources.http import SourceError
from repair.text import mentions_any

logger = logging.getLogger(__name__)

EXPANSION_REQUIRED = {"id": str, "q_model": str, "q_new": str, "d_pos": str, "negative_candidates": list,
                      "source": str}
# "refused": the source answered a 4xx other than 429/401/403 (400, 414 ...): asking again cannot help.
DONE_STATUSES = frozenset({"ok", "no_hits", "no_abstract", "duplicate", "off_concept", "refused"})
ERROR_STATUSES = frozenset({"failed", "refused"})
# What 06 writes as q_new (issue 16): "title" = the verified top hit's title (the paper: its T0 is title ->
# abstract); "generated" = the generator's own query, the top hit still the positive. A line records its form
# only when it is not the default, so default files stay what they were.
QUERY_FORMS = ("title", "generated")
DEFAULT_QUERY_FORM = "title"


def status_path_for(out_jsonl: str | Path) -> Path:
    """``<out>.status.jsonl``: one line per processed item (the last line of an id wins)."""
    return Path(str(out_jsonl) + ".status.jsonl")


# ---------------------------------------------------------------------------------------------- 06
@dataclass
class Verdict:
    status: str  # ok | no_hits | no_abstract | duplicate
    record: dict | None = None
    reason: str = ""


def _meta(p: Paper) -> dict:
    return {"id": p.id, "doi": p.doi, "title": p.title, "year": p.year, "venue": p.venue, "url": p.url}


def mentions_concept(paper: Paper, concepts: list[str]) -> bool:
    """Whether the paper's title or abstract contains one of the concepts as a whole term (case-insensitive)."""
    return mentions_any(f"{paper.title} {paper.abstract}", concepts)


def verify_hits(row: dict, hits: list[Paper], target_k: int, source: str,
                used_positives: Container[str] | None = None, require_concept: bool = False,
                query_form: str = DEFAULT_QUERY_FORM, candidate_scores: bool = False) -> Verdict:
    """Apply the paper's verification rule to one generated query's hits (DESIGN 5 step 6).

    The top hit that has an abstract is the positive (papers without an abstract cannot be d+); q_new is
    its title. The other hits with a non-empty abstract, in rank order and without copies of the positive,
    are D-_cand (at most ``target_k``). A positive in ``used_positives`` (dedup keys of the earlier queries'
    positives) is a ``duplicate``; the record itself never depends on ``used_positives``.
    ``require_concept`` (not in the paper; a stricter option) takes the top hit with an abstract that also
    mentions one of the query's concepts, and calls the query ``off_concept`` when no hit does.
    ``query_form`` "generated" makes q_new the generated query itself (d+ and D-_cand unchanged; the title stays in
    ``pos_meta``), for seed sets whose queries are not titles (issue 16). ``candidate_scores`` also records each
    candidate's ``score`` from the source (issue 43: 06e's lexical-tie guard reads it; off, the file is as before).
    """
    if query_form not in QUERY_FORMS:
        raise ValueError(f"unknown query form {query_form!r}; expected one of {QUERY_FORMS}")
    if not hits:
        return Verdict("no_hits", reason="the source returned no paper")
    with_abstract = [i for i, h in enumerate(hits) if h.abstract.strip() and h.title.strip()]
    if not with_abstract:
        return Verdict("no_abstract", reason=f"none of the {len(hits)} hits has an abstract")
    pos_rank = with_abstract[0]
    if require_concept:
        concepts = row.get("concepts") or []
        pos_rank = next((i for i in with_abstract if mentions_concept(hits[i], concepts)), None)
        if pos_rank is None:
            return Verdict("off_concept", reason=f"no hit with an abstract mentions {concepts}")
    pos = hits[pos_rank]
    if used_positives is not None and pos.dedup_key() in used_positives:
        return Verdict("duplicate", reason=f"positive {pos.id} already verified for another query")
    negatives = []
    for i, h in enumerate(hits):
        if i == pos_rank or not h.abstract.strip() or h.dedup_key() == pos.dedup_key() or h.abstract == pos.abstract:
            continue
        negative = {"id": h.id, "doi": h.doi, "title": h.title, "abstract": h.abstract}
        if candidate_scores and h.score is not None:  # the source's own score (BM25 for the local corpus): 06e's guard
            negative["score"] = round(h.score, 4)
        negatives.append(negative)
        if len(negatives) >= target_k:
            break
    q_new = row["query"] if query_form == "generated" else pos.title
    record = {"id": row["id"], "q_model": row["query"], "concepts": row.get("concepts") or [],
              "q_new": q_new, "d_pos": pos.abstract, "pos_meta": _meta(pos), "pos_rank": pos_rank + 1,
              "n_hits": len(hits), "negative_candidates": negatives, "source": source}
    if pos.score is not None:
        record["pos_score"] = round(pos.score, 4)
    if query_form != DEFAULT_QUERY_FORM:
        record["query_form"] = query_form
    return Verdict("ok", record)


def count_valid(out_jsonl: str | Path) -> int:
    """Valid (verified) tuples in an expansion JSONL: what the driver compares with 2 x |T0|.

    For a ``--mode concept`` file it counts the concept lines that found at least one paper.
    """
    ids: set[str] = set()
    groups = 0
    for rec in iter_appended_jsonl(out_jsonl):
        if "id" in rec:
            ids.add(str(rec["id"]))
        elif rec.get("got_k"):
            groups += 1
    return len(ids) + groups


def read_status(status_path: str | Path) -> dict[str, dict]:
    """Last status line per id."""
    return {rec["id"]: rec for rec in iter_appended_jsonl(status_path, required={"id": str, "status": str})}


@dataclass
class VerificationStats:
    counts: Counter = field(default_factory=Counter)
    skipped_done: int = 0
    valid_before: int = 0
    valid_total: int = 0
    demoted: int = 0  # tuples of later queries that became "duplicate" when a resumed earlier query took the positive
    stopped: str = ""
    seconds: float = 0.0
    last_error: str = ""  # reason of the last failed/refused item of this run (not in the summary)

    def all_failed(self) -> str | None:
        """The one-line error when this run processed items and every one ended in an error (issue 18: 06 used to
        exit 0 then, and the driver went on with nothing new); None otherwise."""
        processed = sum(self.counts.values())
        if not processed or any(status not in ERROR_STATUSES for status in self.counts):
            return None
        failed, refused = self.counts.get("failed", 0), self.counts.get("refused", 0)
        last = " ".join(self.last_error.split())
        if not failed:
            return (f"all {processed} items were refused by the source (a 4xx, not retried by --resume; last error: "
                    f"{last}); check the queries and the source flags")
        what = f"all {processed} items failed" + (f" ({refused} of them refused: a 4xx)" if refused else "")
        return f"{what} (last error: {last}); rerun with --resume"

    def as_dict(self) -> dict:
        return {"processed": dict(self.counts), "skipped_done": self.skipped_done,
                "valid_before": self.valid_before, "valid_total": self.valid_total,
                "demoted_to_duplicate": self.demoted, "stopped": self.stopped, "seconds": round(self.seconds, 2)}


def _run_items(items: list[Any], work: Callable[[Any], Any], workers: int) -> Iterable[tuple[Any, Any]]:
    """Yield (item, result-or-exception) in input order, with up to ``4 * workers`` items searched ahead.

    Input order (not completion order) is what makes the output independent of timing: with two keys and
    429s the items finish in a different order every run. A slow head item (a Retry-After) holds back only
    the writing; the items behind it keep being searched.
    """
    if workers <= 1:
        for item in items:
            try:
                yield item, work(item)
            except Exception as exc:  # noqa: BLE001 - handed to the caller, who decides
                yield item, exc
        return

    def outcome(item: Any, fut: Future) -> tuple[Any, Any]:
        exc = fut.exception()  # waits for it
        return item, exc if exc is not None else fut.result()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        window: deque[tuple[Any, Future]] = deque()
        try:
            for item in items:
                window.append((item, pool.submit(work, item)))
                if len(window) >= 4 * workers:
                    yield outcome(*window.popleft())
            while window:
                yield outcome(*window.popleft())
        finally:
            for _, fut in window:
                fut.cancel()


def verify_items(items: list[Any], search: Callable[[Any], Any], item_id: Callable[[Any], str],
                  on_result: Callable[[Any, Any], bool], *, workers: int, status_log: JsonlAppender,
                  stats: VerificationStats, desc: str, unit: str, progress: bool,
                  stamp: bool) -> SourceError | None:
    """The one worker loop of 06, both modes: search ``items`` (``workers`` in parallel, results in input order),
    record a ``refused`` (a 4xx: not retried) or ``failed`` (retried by ``--resume``) item in the status file and
    ``stats``, hand each result to ``on_result`` (True: stop here). Returns the fatal :class:`SourceError` (bad
    key, quota) that stopped it, recording nothing for its item, or None. ``stamp`` adds a ``time`` field to the
    error lines (query mode's status lines carry one; concept mode's never did)."""
    from tqdm import tqdm

    bar = tqdm(total=len(items), desc=desc, unit=unit, disable=not progress)
    try:
        for item, result in _run_items(items, search, workers):
            bar.update(1)
            if isinstance(result, SourceError) and result.fatal:
                return result
            if isinstance(result, Exception):
                refused = isinstance(result, SourceError) and result.permanent
                if not isinstance(result, SourceError):
                    logger.exception("unexpected error on %s", item_id(item), exc_info=result)
                status = "refused" if refused else "failed"
                stats.counts[status] += 1
                stats.last_error = str(result)[:500]
                line = {"id": item_id(item), "status": status, "reason": str(result)[:500]}
                if refused:
                    line["http_status"] = result.status
                if stamp:
                    line["time"] = round(time.time(), 3)
                status_log.append(line)
                continue
            if on_result(item, result):
                return None
    finally:
        bar.close()
    return None


class _PositivesBefore:
    """The positives of the queries *before* ``index`` in the generated file (``first_use`` maps a positive's
    dedup key to the lowest index that verified it): what a ``duplicate`` verdict may depend on, so a query
    retried by ``--resume`` gets the verdict it would have had in an uninterrupted run."""

    def __init__(self, first_use: dict[str, int], index: int):
        self.first_use, self.index = first_use, index

    def __contains__(self, key: object) -> bool:
        return self.first_use.get(str(key), self.index) < self.index


def _positive_key(rec: dict) -> str:
    """The dedup key of a tuple's positive paper: its DOI, else its title (``pos_meta``'s: with
    ``--query_form generated`` q_new is not the title)."""
    meta = rec.get("pos_meta") or {}
    return Paper(id=meta.get("id", ""), title=meta.get("title") or rec["q_new"], doi=meta.get("doi")).dedup_key()


def _read_generated(generated_jsonl: str | Path) -> list[dict]:
    """06's input rows; a repeated id is an error naming both lines (ids key resume and input order)."""
    rows, first_line = [], {}
    for lineno, row in iter_jsonl(generated_jsonl, required=GENERATED_REQUIRED, optional=GENERATED_OPTIONAL,
                                  with_lineno=True):
        if row["id"] in first_line:
            raise DataError(f"{generated_jsonl}:{lineno}: field 'id': {row['id']!r} repeats line "
                            f"{first_line[row['id']]} (ids must be unique)")
        first_line[row["id"]] = lineno
        rows.append(row)
    return rows


def _capped(row: dict) -> dict:
    """The row with the query text 06 sends: at most ``repair.expansion.sources.base.MAX_QUERY_CHARS`` characters."""
    query = cap_query(row["query"])
    if query == row["query"]:
        return row
    logger.warning("%s: the query is %d characters long; sending (and keeping as q_model) its first %d",
                   row["id"], len(row["query"]), len(query))
    return {**row, "query": query}


def _rewrite_in_input_order(out_jsonl: Path, status_path: Path, order: dict[str, int],
                            dedup: bool) -> int:
    """Put ``out_jsonl`` in generated-file order and keep only the first tuple of each positive; return how
    many tuples became ``duplicate``. A no-op unless a resumed query landed after later ones (the only way
    the order or a duplicate verdict can differ from an uninterrupted run). The status lines of the
    demoted tuples are written first, then the file is replaced atomically: a kill in between leaves a
    file the next run rewrites the same way."""
    if not out_jsonl.exists():
        return 0
    current = list(iter_jsonl(out_jsonl, required=EXPANSION_REQUIRED))
    ranked = sorted(enumerate(current), key=lambda ir: (order.get(ir[1]["id"], len(order)), ir[0]))
    kept, demoted, seen_ids, holder = [], [], set(), {}
    for _, rec in ranked:
        if rec["id"] in seen_ids:
            continue
        seen_ids.add(rec["id"])
        key = _positive_key(rec)
        if dedup and key in holder:
            demoted.append((rec, holder[key]))
            continue
        holder.setdefault(key, rec["id"])
        kept.append(rec)
    if kept == current:
        return 0
    with JsonlAppender(status_path) as status_log:
        for rec, earlier in demoted:
            status_log.append({"id": rec["id"], "status": "duplicate", "reason": f"positive {rec['pos_meta']['id']} "
                               f"is also verified for {earlier}, which comes first in the generated file",
                               "time": round(time.time(), 3)})
    write_jsonl(out_jsonl, kept)
    if demoted:
        logger.info("%d tuple(s) became duplicate: an earlier query retried by --resume verified the same "
                    "positive", len(demoted))
    return len(demoted)


def check_new_outputs(out_jsonl: Path, status_path: Path, resume: bool) -> None:
    """Refuse to start over a non-empty output (or status file) without ``resume``: appending to it by mistake
    would mix two runs."""
    if not resume and ((out_jsonl.exists() and out_jsonl.stat().st_size) or
                       (status_path.exists() and status_path.stat().st_size)):
        raise FileExistsError(f"{out_jsonl} (or its status file) already exists; pass --resume to continue, "
                              "or choose a new --out_jsonl")


def run_verification(source: LiteratureSource, generated_jsonl: str | Path, out_jsonl: str | Path, *,
                     target_k: int = 20, search_k: int | None = None, status_path: str | Path | None = None,
                     resume: bool = False, target_valid: int | None = None, workers: int = 1,
                     max_items: int | None = None, item_sleep: float = 0.0, allow_duplicate_positives: bool = False,
                     require_concept: bool = False, query_form: str = DEFAULT_QUERY_FORM,
                     candidate_scores: bool = False, progress: bool = True) -> VerificationStats:
    """Verify every generated query not done yet; append tuples to ``out_jsonl``, statuses beside it.

    A query is done once its tuple is in ``out_jsonl`` or its last status is one of :data:`DONE_STATUSES`;
    ``failed`` ones (network, 5xx after retries, timeouts) are retried by the next ``--resume``; ``refused``
    ones (a 4xx such as 400 or 414) are not. A fatal :class:`SourceError` (rejected key, exhausted quota)
    stops the run after recording nothing for the item, and is raised. Stops early when ``target_valid``
    tuples exist. Verdicts are decided and written in input order (see the module docstring), so the
    output does not depend on workers, timing, failures or resumes. An empty generated file is an error
    (05 produced nothing) unless 05 recorded finished rounds that rejected every completion (a warning).
    ``query_form`` (:data:`QUERY_FORMS`) picks what q_new is; a resumed file must keep the form it was made with.
    """
    out_jsonl = Path(out_jsonl)
    status_path = Path(status_path) if status_path else status_path_for(out_jsonl)
    rows = _read_generated(generated_jsonl)
    if not rows:
        totals = generation_summary(generated_jsonl)
        if not totals["rounds"]:
            raise DataError(f"{generated_jsonl}: holds no generated query: 05 produced nothing (did it run to "
                            "the end? see its log)")
        logger.warning("%s holds no query: 05 finished %d round(s) and rejected all %d completions (%s); nothing "
                       "to verify", generated_jsonl, totals["rounds"], totals["generated"], totals["rejected"])
    check_new_outputs(out_jsonl, status_path, resume)
    order = {row["id"]: i for i, row in enumerate(rows)}
    statuses = read_status(status_path)
    first_use: dict[str, int] = {}  # positive's dedup key -> lowest input index whose tuple holds it
    done: set[str] = set()
    if out_jsonl.exists():
        for lineno, rec in iter_appended_jsonl(out_jsonl, required=EXPANSION_REQUIRED, with_lineno=True):
            if rec.get("query_form", DEFAULT_QUERY_FORM) != query_form:
                raise DataError(f"{out_jsonl}:{lineno}: field 'query_form': this file was made with --query_form "
                                f"{rec.get('query_form', DEFAULT_QUERY_FORM)}, not {query_form}; resume with the "
                                "same form or choose a new --out_jsonl")
            done.add(rec["id"])
            key, index = _positive_key(rec), order.get(rec["id"], len(rows))
            first_use[key] = min(first_use.get(key, index), index)
    done |= {i for i, s in statuses.items() if s["status"] in DONE_STATUSES}
    stats = VerificationStats(valid_before=count_valid(out_jsonl))
    todo = [r for r in rows if r["id"] not in done]
    stats.skipped_done = len(rows) - len(todo)
    if max_items is not None:
        todo = todo[:max_items]
    if rows and not todo:
        logger.info("nothing left to verify: all %d queries of %s are done", len(rows), generated_jsonl)
    todo = [_capped(r) for r in todo]
    valid = stats.valid_before
    if target_valid is not None and valid >= target_valid:
        stats.valid_total, stats.stopped = valid, "target_valid reached before start"
        return stats
    k = search_k or target_k + 1
    t0 = time.time()

    def search(row: dict) -> list[Paper]:
        hits = source.search(row["query"], k)
        if item_sleep:
            time.sleep(item_sleep)
        return hits

    def take(row: dict, hits: list[Paper]) -> bool:
        nonlocal valid
        index = order[row["id"]]
        verdict = verify_hits(row, hits, target_k, source.name,
                              None if allow_duplicate_positives else _PositivesBefore(first_use, index),
                              require_concept, query_form, candidate_scores)
        if verdict.record is not None:
            out.append(verdict.record)  # the tuple first: a kill before the status line loses nothing
            key = _positive_key(verdict.record)
            first_use[key] = min(first_use.get(key, index), index)
            valid += 1
        stats.counts[verdict.status] += 1
        status_log.append({"id": row["id"], "status": verdict.status, "reason": verdict.reason,
                           "n_hits": len(hits), "time": round(time.time(), 3)})
        if target_valid is not None and valid >= target_valid:
            stats.stopped = f"target_valid={target_valid} reached"
            return True
        return False

    with JsonlAppender(out_jsonl) as out, JsonlAppender(status_path) as status_log:
        fatal = verify_items(todo, search, lambda row: row["id"], take, workers=workers, status_log=status_log,
                              stats=stats, desc=f"06 verify ({source.name})", unit="query", progress=progress,
                              stamp=True)
    stats.demoted = _rewrite_in_input_order(out_jsonl, status_path, order, not allow_duplicate_positives)
    stats.valid_total = count_valid(out_jsonl)
    stats.seconds = time.time() - t0
    if fatal is not None:
        stats.stopped = f"fatal: {fatal}"
        raise fatal
    return stats
