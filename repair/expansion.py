"""Stage II, Expansion (DESIGN 5 steps 5-6): grounded query generation and verification in a literature source.

05 (:func:`generate_queries`): each query samples 1-3 concepts of C_conf, grounds them in PubChem /
Materials Project (failures recorded, not fatal), prompts the generator with the paper's prompt and keeps
the cleaned query. Queries come in rounds of ``round_size``; round ``r`` is fully determined by
``(seed, r)``, so ids ``r{r}-{j}`` are stable across resumes and invocations.

06 (:func:`run_verification`): each generated query is searched in a literature source. No hits: discarded.
Otherwise the best hit with an abstract gives q_new (its title) and d+ (its abstract), the other hits with an
abstract (up to ``target_k``) are D-_cand. One complete output line per verified query, a status line per
processed query (``ok | no_hits | no_abstract | duplicate | off_concept | refused | failed``); ``--resume``
skips everything but ``failed``. The output is a function of the inputs only (issue 18): searches run in
parallel but verdicts are decided and written in the generated file's order, a positive counts as a
``duplicate`` only against queries *before* it in that order, and a run that resumed failed items rewrites
the output in input order, so any number of keys, 429s, failures and resumes gives the same bytes. The
driver repeats 05 -> 06 until :func:`count_valid` reaches 2 x |T0| (docs/expansion.md).

What q_new is (issue 16, ``QUERY_FORM``): the top hit's title (default, the paper, whose T0 is title -> abstract),
the generated query itself (``query_form="generated"``), or a query rewritten in T0's own style after verification
(:func:`rewrite_t0_style`, ``expansion/06c_t0_style_queries.py``). 06 exits non-zero when every item of a run
failed (:meth:`VerificationStats.all_failed`).

``--mode concept`` (:func:`run_concept_mode`) keeps the original behaviour: every concept string is searched
and all its hits are written as one group line ``{concept, got_k, papers}``; :func:`concept_groups_to_tuples`
turns such a file into expansion tuples (each paper with an abstract becomes a q_new/d+ pair, the rest of its
group its negative candidates, as the original's steps 7-9 used them).
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Container, Iterable

from .data import DataError, JsonlAppender, SeedSet, iter_jsonl, read_jsonl, read_lines, write_jsonl
from .generation import (DEFAULT_SAMPLING, PROMPT_IDS, T0_STYLE_PROMPT_ID, build_prompt, build_t0_style_prompt,
                         clean_query, shared_content_words, t0_query_style)
from .sources.base import LiteratureSource, Paper, cap_query
from .sources.http import SourceError

logger = logging.getLogger(__name__)

GENERATED_REQUIRED = {"id": str, "query": str}
GENERATED_OPTIONAL = {"concepts": list[str], "round": int, "attributes": dict, "grounding_errors": dict,
                      "prompt_id": str, "generator": dict}
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


def rounds_path_for(out_jsonl: str | Path) -> Path:
    """``<out>.rounds.jsonl``: one line per finished 05 round, with its rejected completions."""
    return Path(str(out_jsonl) + ".rounds.jsonl")


def read_concepts(path: str | Path) -> list[str]:
    """C_conf from ``final_terms.bottom_{pp}pct.txt``: ``#`` lines skipped, case-insensitive de-dup, order kept."""
    seen: set[str] = set()
    out = []
    for term in read_lines(path):
        if term.lower() not in seen:
            seen.add(term.lower())
            out.append(term)
    if not out:
        raise DataError(f"{path}: holds no concept (one concept per line)")
    return out


# ---------------------------------------------------------------------------------------------- grounding
class Grounder:
    """Attributes of a concept from PubChem and/or the Materials Project, memoised.

    A concept PubChem does not know, or that is no formula for MP, is recorded as a grounding error and
    the query is still generated (DESIGN 5 step 5). A fatal error (bad key) turns that source off for the
    rest of the run, with one warning.
    """

    def __init__(self, pubchem: Any = None, materials_project: Any = None):
        self.pubchem, self.mp = pubchem, materials_project
        self._memo: dict[str, tuple[dict, str | None]] = {}
        self.counts: Counter = Counter()

    @property
    def enabled(self) -> bool:
        return self.pubchem is not None or self.mp is not None

    def _call(self, which: str, fn: Callable[[str], dict | None], arg: str) -> tuple[dict | None, str | None]:
        try:
            return fn(arg), None
        except SourceError as exc:
            if exc.fatal:
                logger.warning("grounding: %s turned off for this run: %s", which, exc)
                setattr(self, "pubchem" if which == "pubchem" else "mp", None)
            return None, str(exc)

    def ground(self, concept: str) -> tuple[dict, str | None]:
        """({"pubchem": {...}, "materials_project": {...}} with the sources that found it, error text or None)."""
        if concept in self._memo:
            return self._memo[concept]
        from .sources.materials_project import looks_like_formula

        attrs: dict[str, dict] = {}
        errors: list[str] = []
        if self.pubchem is not None:
            found, err = self._call("pubchem", self.pubchem.ground, concept)
            if found:
                attrs["pubchem"] = found
            else:
                errors.append(err or f"pubchem: no compound named {concept!r}")
        if self.mp is not None:
            formula = concept if looks_like_formula(concept) else (attrs.get("pubchem") or {}).get("formula")
            if not formula:
                errors.append(f"materials_project: {concept!r} is not a chemical formula")
            else:
                found, err = self._call("materials_project", self.mp.ground, formula)
                if found:
                    attrs["materials_project"] = found
                else:
                    errors.append(err or f"materials_project: no material with formula {formula!r}")
        self.counts["grounded" if attrs else "ungrounded"] += 1
        result = (attrs, "; ".join(errors) or None)  # a partial failure stays visible beside what was found
        self._memo[concept] = result
        return result


# ---------------------------------------------------------------------------------------------- 05
def sample_concepts(concepts: list[str], rng: random.Random, min_k: int = 1, max_k: int = 3) -> list[str]:
    """1-3 distinct concepts of C_conf (the paper's sampling), fewer when C_conf is smaller."""
    k = rng.randint(min_k, max(min_k, max_k))
    return rng.sample(concepts, min(k, len(concepts)))


@dataclass
class GenerationStats:
    rounds_done: int = 0
    rounds_skipped: int = 0
    generated: int = 0
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)
    total_accepted_in_file: int = 0

    def as_dict(self) -> dict:
        return {"rounds_done": self.rounds_done, "rounds_skipped": self.rounds_skipped,
                "generated": self.generated, "accepted": self.accepted, "rejected": dict(self.rejected),
                "total_accepted_in_file": self.total_accepted_in_file}


def _existing_ids(path: Path, required: dict) -> set[str]:
    if not path.exists():
        return set()
    JsonlAppender(path).close()  # cut a partial last line left by a killed run before reading
    return {rec["id"] for rec in iter_jsonl(path, required=required)}


def _existing_rounds(path: Path, settings: dict) -> set[int]:
    """Finished rounds of a 05 file; a file made with another seed / round size / prompt cannot be resumed
    (its ids would mean different queries)."""
    if not path.exists():
        return set()
    JsonlAppender(path).close()
    done = set()
    for lineno, rec in enumerate(iter_jsonl(path, required={"round": int}), start=1):
        for name, value in settings.items():
            if name in rec and rec[name] != value:
                raise ValueError(f"{path}:{lineno}: this file was generated with {name}={rec[name]!r}, not "
                                 f"{value!r}; resume with the same settings or start a new --out_jsonl")
        done.add(rec["round"])
    return done


def generate_queries(concepts: list[str], generator: Any, out_jsonl: str | Path, *, num_queries: int,
                     round_size: int = 8, seed: int = 42, grounder: Grounder | None = None,
                     template: str = "paper", min_concepts: int = 1, max_concepts: int = 3,
                     sampling: dict | None = None, resume: bool = False, progress: bool = True) -> GenerationStats:
    """Write generated queries (SCHEMAS "generated queries JSONL") until ``num_queries`` (rounded up to whole
    rounds) have been attempted in ``out_jsonl``; with ``resume`` finished rounds are skipped."""
    from tqdm import tqdm

    out_jsonl = Path(out_jsonl)
    rounds_file = rounds_path_for(out_jsonl)
    if not resume and ((out_jsonl.exists() and out_jsonl.stat().st_size) or rounds_file.exists()):
        raise FileExistsError(f"{out_jsonl} already exists; pass --resume to continue it, or choose a new path")
    sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
    grounder = grounder or Grounder()
    if template == "original":
        min_concepts = max_concepts = 1
    existing = _existing_ids(out_jsonl, GENERATED_REQUIRED)
    settings = {"seed": seed, "round_size": round_size, "prompt_id": PROMPT_IDS[template]}
    done_rounds = _existing_rounds(rounds_file, settings)
    n_rounds = math.ceil(num_queries / round_size)
    stats = GenerationStats()
    info = generator.describe() if hasattr(generator, "describe") else {"backend": "custom"}
    describe = {k: info[k] for k in ("backend", "model", "adapter") if info.get(k) is not None}
    with JsonlAppender(out_jsonl) as out, JsonlAppender(rounds_file) as rounds_log:
        for r in tqdm(range(n_rounds), desc="05 query generation", unit="round", disable=not progress):
            if r in done_rounds:
                stats.rounds_skipped += 1
                continue
            rng = random.Random(f"{seed}:{r}")  # round r depends on (seed, r) only: stable ids on resume
            picks = [sample_concepts(concepts, rng, min_concepts, max_concepts) for _ in range(round_size)]
            attributes, errors = {}, {}
            for concept in {c for pick in picks for c in pick}:
                attributes[concept], errors[concept] = grounder.ground(concept) if grounder.enabled else ({}, None)
            prompts = [build_prompt(pick, attributes, template) for pick in picks]
            raws = generator.generate(prompts, n=1, seed=seed * 100_003 + r, **sampling)
            rejected = []
            accepted = 0
            for j, (pick, prompt, raw) in enumerate(zip(picks, prompts, raws)):
                qid = f"r{r}-{j}"
                query, reason = clean_query(raw, prompt)
                stats.generated += 1
                if query is None:
                    stats.rejected[reason] += 1
                    rejected.append({"id": qid, "reason": reason, "raw": raw})
                    continue
                accepted += 1
                stats.accepted += 1
                if qid in existing:
                    continue
                out.append({"id": qid, "round": r, "concepts": pick,
                            "attributes": {c: attributes[c] for c in pick if attributes.get(c)},
                            "grounding_errors": {c: errors[c] for c in pick if errors.get(c)},
                            "prompt_id": PROMPT_IDS[template], "query": query,
                            "generator": {**describe, "seed": seed}})
            rounds_log.append({"round": r, **settings, "generated": len(raws), "accepted": accepted,
                               "rejected": rejected})
            stats.rounds_done += 1
    stats.total_accepted_in_file = len(_existing_ids(out_jsonl, GENERATED_REQUIRED))
    return stats


def generation_summary(out_jsonl: str | Path) -> dict:
    """Totals over every finished round of a generated-queries file (all invocations)."""
    rounds_file = rounds_path_for(out_jsonl)
    totals = {"rounds": 0, "generated": 0, "accepted": 0, "rejected": Counter()}
    if rounds_file.exists():
        for rec in iter_jsonl(rounds_file, required={"round": int, "generated": int, "accepted": int}):
            totals["rounds"] += 1
            totals["generated"] += rec["generated"]
            totals["accepted"] += rec["accepted"]
            totals["rejected"].update(r["reason"] for r in rec.get("rejected", []))
    totals["rejected"] = dict(totals["rejected"])
    return totals


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
    text = f"{paper.title} {paper.abstract}".lower()
    return any(re.search(r"(?<!\w)" + re.escape(c.lower()) + r"(?!\w)", text) for c in concepts if c.strip())


def verify_hits(row: dict, hits: list[Paper], target_k: int, source: str,
                used_positives: Container[str] | None = None, require_concept: bool = False,
                query_form: str = DEFAULT_QUERY_FORM) -> Verdict:
    """Apply the paper's verification rule to one generated query's hits (DESIGN 5 step 6).

    The top hit that has an abstract is the positive (papers without an abstract cannot be d+); q_new is
    its title. The other hits with a non-empty abstract, in rank order and without copies of the positive,
    are D-_cand (at most ``target_k``). A positive in ``used_positives`` (dedup keys of the earlier queries'
    positives) is a ``duplicate``; the record itself never depends on ``used_positives``.
    ``require_concept`` (not in the paper; a stricter option) takes the top hit with an abstract that also
    mentions one of the query's concepts, and calls the query ``off_concept`` when no hit does.
    ``query_form`` "generated" makes q_new the generated query itself (d+ and D-_cand unchanged; the title stays in
    ``pos_meta``), for seed sets whose queries are not titles (issue 16).
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
        negatives.append({"id": h.id, "doi": h.doi, "title": h.title, "abstract": h.abstract})
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
    path = Path(out_jsonl)
    if not path.exists():
        return 0
    JsonlAppender(path).close()
    ids: set[str] = set()
    groups = 0
    for rec in iter_jsonl(path):
        if "id" in rec:
            ids.add(str(rec["id"]))
        elif rec.get("got_k"):
            groups += 1
    return len(ids) + groups


def read_status(status_path: str | Path) -> dict[str, dict]:
    """Last status line per id."""
    path = Path(status_path)
    if not path.exists():
        return {}
    JsonlAppender(path).close()
    return {rec["id"]: rec for rec in iter_jsonl(path, required={"id": str, "status": str})}


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
    """The row with the query text 06 sends: at most ``repair.sources.base.MAX_QUERY_CHARS`` characters."""
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


def _open_outputs(out_jsonl: Path, status_path: Path, resume: bool) -> None:
    if not resume and ((out_jsonl.exists() and out_jsonl.stat().st_size) or
                       (status_path.exists() and status_path.stat().st_size)):
        raise FileExistsError(f"{out_jsonl} (or its status file) already exists; pass --resume to continue, "
                              "or choose a new --out_jsonl")


def run_verification(source: LiteratureSource, generated_jsonl: str | Path, out_jsonl: str | Path, *,
                     target_k: int = 20, search_k: int | None = None, status_path: str | Path | None = None,
                     resume: bool = False, target_valid: int | None = None, workers: int = 1,
                     max_items: int | None = None, item_sleep: float = 0.0, allow_duplicate_positives: bool = False,
                     require_concept: bool = False, query_form: str = DEFAULT_QUERY_FORM,
                     progress: bool = True) -> VerificationStats:
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
    from tqdm import tqdm

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
    _open_outputs(out_jsonl, status_path, resume)
    order = {row["id"]: i for i, row in enumerate(rows)}
    statuses = read_status(status_path)
    first_use: dict[str, int] = {}  # positive's dedup key -> lowest input index whose tuple holds it
    done: set[str] = set()
    if out_jsonl.exists():
        JsonlAppender(out_jsonl).close()
        for lineno, rec in iter_jsonl(out_jsonl, required=EXPANSION_REQUIRED, with_lineno=True):
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

    fatal: SourceError | None = None
    with JsonlAppender(out_jsonl) as out, JsonlAppender(status_path) as status_log:
        bar = tqdm(total=len(todo), desc=f"06 verify ({source.name})", unit="query", disable=not progress)
        for row, result in _run_items(todo, search, workers):
            bar.update(1)
            if isinstance(result, SourceError) and result.fatal:
                fatal = result
                break
            if isinstance(result, SourceError) and result.permanent:
                stats.counts["refused"] += 1
                stats.last_error = str(result)[:500]
                status_log.append({"id": row["id"], "status": "refused", "reason": str(result)[:500],
                                   "http_status": result.status, "time": round(time.time(), 3)})
                continue
            if isinstance(result, Exception):
                if not isinstance(result, SourceError):
                    logger.exception("unexpected error on %s", row["id"], exc_info=result)
                stats.counts["failed"] += 1
                stats.last_error = str(result)[:500]
                status_log.append({"id": row["id"], "status": "failed", "reason": str(result)[:500],
                                   "time": round(time.time(), 3)})
                continue
            index = order[row["id"]]
            verdict = verify_hits(row, result, target_k, source.name,
                                  None if allow_duplicate_positives else _PositivesBefore(first_use, index),
                                  require_concept, query_form)
            if verdict.record is not None:
                out.append(verdict.record)  # the tuple first: a kill before the status line loses nothing
                key = _positive_key(verdict.record)
                first_use[key] = min(first_use.get(key, index), index)
                valid += 1
            stats.counts[verdict.status] += 1
            status_log.append({"id": row["id"], "status": verdict.status, "reason": verdict.reason,
                               "n_hits": len(result), "time": round(time.time(), 3)})
            if target_valid is not None and valid >= target_valid:
                stats.stopped = f"target_valid={target_valid} reached"
                break
        bar.close()
    stats.demoted = _rewrite_in_input_order(out_jsonl, status_path, order, not allow_duplicate_positives)
    stats.valid_total = count_valid(out_jsonl)
    stats.seconds = time.time() - t0
    if fatal is not None:
        stats.stopped = f"fatal: {fatal}"
        raise fatal
    return stats


# ---------------------------------------------------------------------------------------------- concept mode
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
    from tqdm import tqdm

    out_jsonl = Path(out_jsonl)
    status_path = Path(status_path) if status_path else status_path_for(out_jsonl)
    _open_outputs(out_jsonl, status_path, resume)
    written: set[str] = set()
    if out_jsonl.exists():
        JsonlAppender(out_jsonl).close()
        written = {rec["concept"].lower() for rec in iter_jsonl(out_jsonl, required={"concept": str})}
    refused = {c.lower() for c, st in read_status(status_path).items() if st["status"] == "refused"}
    todo = [c for c in concepts if c.lower() not in written | refused]
    stats = VerificationStats(valid_before=len(written), skipped_done=len(concepts) - len(todo))

    def search(concept: str) -> tuple[list[Paper], float]:
        start = time.time()
        hits = source.search(cap_query(concept), 2 * target_k)  # spare hits, so abstract-less ones go last
        if item_sleep:
            time.sleep(item_sleep)
        return hits, time.time() - start

    t0 = time.time()
    fatal = None
    with JsonlAppender(out_jsonl) as out, JsonlAppender(status_path) as status_log:
        bar = tqdm(total=len(todo), desc=f"06 concepts ({source.name})", unit="concept", disable=not progress)
        for concept, result in _run_items(todo, search, workers):
            bar.update(1)
            if isinstance(result, SourceError) and result.fatal:
                fatal = result
                break
            if isinstance(result, SourceError) and result.permanent:
                stats.counts["refused"] += 1
                stats.last_error = str(result)[:500]
                status_log.append({"id": concept, "status": "refused", "reason": str(result)[:500],
                                   "http_status": result.status})
                continue
            if isinstance(result, Exception):
                stats.counts["failed"] += 1
                stats.last_error = str(result)[:500]
                status_log.append({"id": concept, "status": "failed", "reason": str(result)[:500]})
                continue
            hits, elapsed = result
            papers = sorted(hits, key=lambda p: 0 if p.abstract else 1)[:target_k]
            out.append({"concept": concept, "got_k": len(papers), "papers": [_paper_line(p) for p in papers],
                        "elapsed_sec": round(elapsed, 3)})
            status = "ok" if papers else "no_hits"
            stats.counts[status] += 1
            status_log.append({"id": concept, "status": status, "n_hits": len(papers)})
        bar.close()
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


# ---------------------------------------------------------------------------------------------- T0-style queries
T0_ON_FAILURE = ("keep_title", "drop")
T0_REWRITE_STATUSES = ("rewritten", "kept_title", "dropped")


def draw_t0_examples(seed_set: SeedSet, key: str, k: int, seed: int, exclude: str = "") -> list[int]:
    """The rows of T0 shown as examples for the tuple ``key``: a function of (seed, key) only, so a resumed,
    reordered or grown input draws the same ones for a tuple. A row whose passage contains ``exclude`` (the
    tuple's own abstract, when the literature source is T0's corpus) is skipped: its query would be the answer."""
    n = len(seed_set)
    rng = random.Random(f"{seed}:t0-examples:{key}")
    excluded = " ".join(exclude.split())
    # a small T0 is shuffled whole; a large one sampled with replacement (O(k), not O(|T0|), per tuple)
    candidates: Iterable[int] = rng.sample(range(n), n) if n <= 8 * k else (rng.randrange(n) for _ in range(64 * k))
    picks: list[int] = []
    for i in candidates:
        if i in picks or (excluded and excluded in " ".join(seed_set.passages[i].split())):
            continue
        picks.append(i)
        if len(picks) == k:
            break
    return picks


def t0_max_words(queries: list[str]) -> int:
    """The default length limit of a T0-style query: twice the 90th percentile of T0's query lengths (words), at
    least 12, so a claim set does not get paragraph-long "claims"."""
    lengths = sorted(len(re.findall(r"\w+", q)) for q in queries)
    return max(12, 2 * lengths[int(0.9 * (len(lengths) - 1))]) if lengths else 12


@dataclass
class T0StyleStats:
    style: str = ""
    max_words: int = 0
    tuples: int = 0
    skipped_done: int = 0
    rewritten: int = 0
    kept_title: int = 0
    dropped: int = 0
    prompts: int = 0  # prompts sent to the generator this run (retries included)
    rejected: Counter = field(default_factory=Counter)  # cleaning verdicts of the rejected completions

    def as_dict(self) -> dict:
        return {"style": self.style, "max_words": self.max_words, "tuples": self.tuples,
                "skipped_done": self.skipped_done, "rewritten": self.rewritten, "kept_title": self.kept_title,
                "dropped": self.dropped, "prompts": self.prompts, "rejected": dict(self.rejected)}


def _read_expansion_for_rewrite(path: str | Path) -> list[dict]:
    """06's tuples, ids unique; a file that already holds T0-style queries (``q_title``) is refused (its q_new
    would be rewritten again and ``q_title`` lost)."""
    rows, first_line = [], {}
    for lineno, rec in iter_jsonl(path, required=EXPANSION_REQUIRED, with_lineno=True):
        if rec["id"] in first_line:
            raise DataError(f"{path}:{lineno}: field 'id': {rec['id']!r} repeats line {first_line[rec['id']]} "
                            "(ids must be unique)")
        if "q_title" in rec:
            raise DataError(f"{path}:{lineno}: field 'q_title': this line was already rewritten in T0's style; give "
                            "06's expansion JSONL as input")
        first_line[rec["id"]] = lineno
        rows.append(rec)
    return rows


def _t0_done(out_jsonl: Path, status_path: Path, settings: dict) -> set[str]:
    """Ids already written (or dropped) by an earlier run with the same settings; other settings are an error."""
    done: set[str] = set()
    for path in (out_jsonl, status_path):
        if not path.exists():
            continue
        JsonlAppender(path).close()  # cut a partial last line left by a killed run
        for lineno, rec in iter_jsonl(path, required={"id": str, "t0_rewrite": dict}, with_lineno=True):
            for name, value in settings.items():
                if rec["t0_rewrite"].get(name) != value:
                    raise ValueError(f"{path}:{lineno}: this file was written with {name}="
                                     f"{rec['t0_rewrite'].get(name)!r}, not {value!r}; resume with the same settings "
                                     "or choose a new --out_jsonl")
            if path == out_jsonl or rec["t0_rewrite"].get("status") == "dropped":
                done.add(rec["id"])
    return done


def rewrite_t0_style(expansion_jsonl: str | Path, seed_set: SeedSet, generator: Any, out_jsonl: str | Path, *,
                     k: int = 3, seed: int = 42, style: str = "auto", chunk_size: int = 8, attempts: int = 2,
                     on_failure: str = "keep_title", max_passage_chars: int = 1000, min_words: int = 3,
                     max_words: int | None = None, min_shared_words: int = 2, sampling: dict | None = None,
                     resume: bool = False, progress: bool = True) -> T0StyleStats:
    """QUERY_FORM=t0 (issue 16): rewrite each verified tuple's q_new as a query in T0's own style.

    The generator sees ``k`` (query, passage) examples of T0 (:func:`draw_t0_examples`) and the tuple's d+, and
    writes one query (:func:`repair.generation.build_t0_style_prompt`); :func:`repair.generation.clean_query`
    rejects echoes of the prompt (the examples' queries, the passage's sentences), empty, too short and too long
    (``max_words``, default :func:`t0_max_words`) answers, and ``off_passage`` ones that share fewer than
    ``min_shared_words`` content words with d+ (a small generator drifts off topic); rejected answers are asked
    again, up to ``attempts`` generations in all.
    A tuple whose rewrite still fails keeps its title (``on_failure`` "keep_title": no verified tuple is lost; the
    line says ``query_form: title``) or is left out ("drop"); both are counted. Output lines are 06's with q_new
    replaced, the title in ``q_title``, ``query_form`` and a ``t0_rewrite`` record; ids, d+ and the candidates are
    unchanged. Tuples go in chunks of ``chunk_size`` fixed by input position, each sampled with a seed of (seed,
    chunk): a resumed run regenerates a partly written chunk whole, so it writes the same bytes as one
    uninterrupted run. Lines are appended one complete line at a time; ``resume`` skips the ids done.
    """
    from tqdm import tqdm

    if on_failure not in T0_ON_FAILURE:
        raise ValueError(f"unknown on_failure {on_failure!r}; expected one of {T0_ON_FAILURE}")
    if k < 1 or attempts < 1 or chunk_size < 1:
        raise ValueError("k, attempts and chunk_size must be at least 1")
    if not len(seed_set):
        raise DataError(f"{seed_set.source}: T0 holds no (query, passage) row to draw examples from")
    out_jsonl = Path(out_jsonl)
    status_path = status_path_for(out_jsonl)
    rows = _read_expansion_for_rewrite(expansion_jsonl)
    if not rows:
        logger.warning("%s holds no verified tuple: nothing to rewrite", expansion_jsonl)
    _open_outputs(out_jsonl, status_path, resume)
    inferred = style == "auto"
    style = t0_query_style(seed_set.queries) if inferred else style
    max_words = max_words or t0_max_words(seed_set.queries)
    sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
    settings = {"prompt_id": T0_STYLE_PROMPT_ID, "seed": seed, "k": k, "style": style, "chunk_size": chunk_size}
    done = _t0_done(out_jsonl, status_path, settings)
    info = generator.describe() if hasattr(generator, "describe") else {"backend": "custom"}
    describe = {key: info[key] for key in ("backend", "model", "adapter") if info.get(key) is not None}
    example_ids = seed_set.query_ids or [str(r) for r in seed_set.kept_rows] or [str(i) for i in range(len(seed_set))]
    stats = T0StyleStats(style=style, max_words=max_words, tuples=len(rows))
    logger.info("T0-style queries: style %s (%s), %d examples per prompt, at most %d words", style,
                "inferred from T0's queries" if inferred else "given", k, max_words)
    with JsonlAppender(out_jsonl) as out, JsonlAppender(status_path) as status_log:
        chunks = list(enumerate(range(0, len(rows), chunk_size)))
        for c, start in tqdm(chunks, desc="T0-style queries", unit="chunk", disable=not progress):
            chunk = rows[start:start + chunk_size]
            if all(row["id"] in done for row in chunk):
                stats.skipped_done += len(chunk)
                continue
            examples = [draw_t0_examples(seed_set, row["id"], k, seed, row["d_pos"]) for row in chunk]
            prompts = [build_t0_style_prompt([(seed_set.queries[i], seed_set.passages[i]) for i in picks],
                                             row["d_pos"], style, max_passage_chars)
                       for row, picks in zip(chunk, examples)]
            queries: list[str | None] = [None] * len(chunk)
            used: list[int] = [0] * len(chunk)
            reasons: list[list[str]] = [[] for _ in chunk]
            pending = list(range(len(chunk)))
            for attempt in range(attempts):
                if not pending:
                    break
                raws = generator.generate([prompts[i] for i in pending], n=1,
                                          seed=(seed * 100_003 + c) * attempts + attempt, **sampling)
                stats.prompts += len(pending)
                still = []
                for i, raw in zip(pending, raws):
                    used[i] = attempt + 1
                    query, reason = clean_query(raw, prompts[i], min_words=min_words, max_words=max_words)
                    if query is not None and shared_content_words(query, chunk[i]["d_pos"]) < min_shared_words:
                        query, reason = None, "off_passage"
                    if query is None:
                        reasons[i].append(reason)
                        stats.rejected[reason] += 1
                        still.append(i)
                    else:
                        queries[i] = query
                pending = still
            for i, row in enumerate(chunk):
                if row["id"] in done:
                    stats.skipped_done += 1
                    continue
                title = (row.get("pos_meta") or {}).get("title") or row["q_new"]
                trace = {"status": "rewritten", **settings, "attempts": used[i], "rejected": reasons[i],
                         "examples": [example_ids[j] for j in examples[i]], "generator": describe}
                if queries[i] is not None:
                    out.append({**row, "q_new": queries[i], "q_title": title, "query_form": "t0", "t0_rewrite": trace})
                    stats.rewritten += 1
                elif on_failure == "keep_title":
                    trace["status"] = "kept_title"
                    out.append({**row, "q_title": title, "query_form": row.get("query_form", DEFAULT_QUERY_FORM),
                                "t0_rewrite": trace})
                    stats.kept_title += 1
                else:
                    trace["status"] = "dropped"
                    stats.dropped += 1
                status_log.append({"id": row["id"], "t0_rewrite": {key: trace[key] for key in
                                                                   ("status", *settings, "attempts", "rejected")}})
    order = {row["id"]: i for i, row in enumerate(rows)}
    current = read_jsonl(out_jsonl)
    ranked = sorted(current, key=lambda rec: order.get(rec["id"], len(order)))
    if ranked != current:  # only when the input changed between runs: keep the output in input order
        write_jsonl(out_jsonl, ranked)
    return stats
