"""Training examples for the trainer: T0 pairs + any number of triplet files, and the layout of one batch.

An example is (query, positive, hard negatives with their source). T0 rows (``repair.data.load_seed``) have no
hard negative: they contribute in-batch negatives only. Triplet rows (``final_train_data*.jsonl``, SCHEMAS.md)
give ``d_neg`` or the first N of ``hard_negatives``; ``negative_sources`` (parallel to ``hard_negatives``) marks
each one ``mined`` or ``generated`` (absent = all mined), which CausalNeg's QEM needs.

Every text a query is known to be answered by (its positive in any loaded file) is a positive of that query:
such a document is masked in the batch, never used as a negative (the fix of UPSTREAM 5.18 that every stage
shares), and such a hard negative is dropped when the data is read.
"""

from __future__ import annotations

import glob
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from repair.data import NEGATIVE_SOURCES as SOURCES
from repair.data import TRIPLET_OPTIONAL, TRIPLET_REQUIRED, DataError, iter_jsonl, load_seed
from repair.training.losses import BatchTargets
from repair.tables import text_table

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class TrainExample:
    query: str
    positive: str
    negatives: tuple[str, ...] = ()
    negative_sources: tuple[str, ...] = ()  # parallel to negatives: "mined" | "generated"


@dataclass
class SourceStats:
    """What one input contributed (printed as the stats table at the start of a run)."""

    name: str
    rows: int = 0
    kept: int = 0
    dropped_empty: int = 0
    negatives: int = 0
    generated: int = 0
    negatives_dropped_as_positive: int = 0


@dataclass
class TrainingData:
    examples: list[TrainExample]
    positives_of: dict[str, frozenset[str]]
    sources: list[SourceStats] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.examples)


def expand_paths(patterns: Sequence[str]) -> list[str]:
    """Each argument is a path or a glob; a glob that matches nothing is an error (a typo must not train on less)."""
    paths: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise FileNotFoundError(f"{pattern}: no triplet file matches this pattern")
            paths.extend(matches)
        else:
            if not os.path.exists(pattern):
                raise FileNotFoundError(f"{pattern}: no such triplet file")
            paths.append(pattern)
    return paths


def _triplet_negatives(record: dict, where: str, num_hard_negatives: int) -> tuple[list[str], list[str]]:
    """The negatives a triplet row contributes and their sources.

    num_hard_negatives: 1 -> ``d_neg`` (else ``hard_negatives[0]``), the paper's single d- (Eq. 7);
    N > 1 -> the first N of ``hard_negatives``; -1 -> all of them; 0 -> none (in-batch negatives only).
    """
    hard = record.get("hard_negatives") or []
    sources = record.get("negative_sources")
    if sources is None:
        sources = ["mined"] * len(hard)
    if len(sources) != len(hard):
        raise DataError(f"{where}: field 'negative_sources' has {len(sources)} entries but 'hard_negatives' has "
                        f"{len(hard)}; they must be parallel")
    for s in sources:
        if s not in SOURCES:
            raise DataError(f"{where}: field 'negative_sources' holds {s!r}; allowed: {', '.join(SOURCES)}")
    if num_hard_negatives == 0:
        return [], []
    d_neg = record.get("d_neg")
    if not hard:
        return ([d_neg], ["mined"]) if d_neg else ([], [])
    if num_hard_negatives == 1 and d_neg:
        source = sources[hard.index(d_neg)] if d_neg in hard else "mined"
        return [d_neg], [source]
    n = len(hard) if num_hard_negatives < 0 else num_hard_negatives
    return list(hard[:n]), list(sources[:n])


def load_training_data(train_data: Sequence[str] = (), triplets: Sequence[str] = (), *, split: str = "train",
                       all_positives: bool = False, num_hard_negatives: int = 1,
                       max_examples: int | None = None) -> TrainingData:
    """Read T0 sources (``.pt`` / JSONL / BEIR folder) and triplet files into one list of examples."""
    if not train_data and not triplets:
        raise ValueError("no training data: give --train_data and/or --triplets")
    raw: list[tuple[str, str, list[str], list[str], SourceStats]] = []
    stats: list[SourceStats] = []
    for path in train_data:
        seed = load_seed(path, split, all_positives=all_positives)
        st = SourceStats(name=f"{path}" + (f" [{split}]" if Path(path).is_dir() else ""),
                         rows=len(seed) + seed.dropped, dropped_empty=seed.dropped)
        stats.append(st)
        raw.extend((q, p, [], [], st) for q, p in zip(seed.queries, seed.passages))
    for path in expand_paths(triplets):
        st = SourceStats(name=str(path))
        stats.append(st)
        for lineno, rec in enumerate(iter_jsonl(path, TRIPLET_REQUIRED, TRIPLET_OPTIONAL), start=1):
            st.rows += 1
            query, positive = rec["query"].strip(), rec["pos_document"].strip()
            if not query or not positive:
                st.dropped_empty += 1
                continue
            negs, srcs = _triplet_negatives(rec, f"{path}:{lineno}", num_hard_negatives)
            kept = [(n.strip(), s) for n, s in zip(negs, srcs) if n and n.strip()]
            raw.append((query, positive, [n for n, _ in kept], [s for _, s in kept], st))
    if max_examples is not None and max_examples >= 0:
        raw = raw[:max_examples]

    positives: dict[str, set[str]] = defaultdict(set)
    for query, positive, *_ in raw:
        positives[query].add(positive)
    examples: list[TrainExample] = []
    for query, positive, negs, srcs, st in raw:
        own_pos = positives[query]
        keep = [(n, s) for n, s in zip(negs, srcs) if n not in own_pos]
        st.negatives_dropped_as_positive += len(negs) - len(keep)
        st.kept += 1
        st.negatives += len(keep)
        st.generated += sum(s == "generated" for _, s in keep)
        examples.append(TrainExample(query, positive, tuple(n for n, _ in keep), tuple(s for _, s in keep)))
    if not examples:  # name each input and what it held (an empty triplet file alone is legitimate: 09 kept none)
        held = "; ".join(f"{st.name}: {st.rows} rows" + (f", {st.dropped_empty} with an empty query or positive"
                                                          if st.dropped_empty else "") for st in stats)
        names = ", ".join(st.name for st in stats)
        raise DataError(f"{names}: no usable (query, positive) pair to train on ({held})")
    return TrainingData(examples, {q: frozenset(p) for q, p in positives.items()}, stats)


def stats_table(data: TrainingData) -> str:
    """A small fixed-width table: one row per input plus a total."""
    head = ("source", "rows", "kept", "empty", "negatives", "generated", "neg=pos")
    rows = [(s.name[-60:], s.rows, s.kept, s.dropped_empty, s.negatives, s.generated,
             s.negatives_dropped_as_positive) for s in data.sources]
    rows.append(("total", *(sum(r[i] for r in rows) for i in range(1, len(head)))))
    return text_table(rows, head, align="lr")


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of examples for one epoch: a pure function of (seed, epoch), so a resumed run (and every
    DDP rank) visits exactly the same batches."""
    rng = np.random.default_rng([int(seed), int(epoch)])
    return rng.permutation(n)


def split_counts(n: int, world: int) -> list[int]:
    """How many of n examples each rank takes (contiguous, as even as possible)."""
    base, extra = divmod(n, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


@dataclass
class BatchLayout:
    """One global batch laid out rank by rank. Rank r embeds queries[q_slices[r]] and documents[d_slices[r]];
    its documents are its queries' positives followed by their hard negatives. Every rank builds the same
    layout from the same examples, so the all-gathered embeddings line up with ``targets`` everywhere."""

    queries: list[str]
    documents: list[str]
    targets: BatchTargets
    q_slices: list[slice]
    d_slices: list[slice]

    @property
    def n_queries(self) -> int:
        return len(self.queries)


def build_layout(examples: Sequence[TrainExample], positives_of: dict[str, frozenset[str]],
                 world: int = 1) -> BatchLayout:
    """Documents, positive indices, duplicate mask and hard-negative bookkeeping for one global batch."""
    queries: list[str] = []
    documents: list[str] = []
    pos_index: list[int] = []
    neg_owner: list[int] = []
    neg_index: list[int] = []
    neg_generated: list[bool] = []
    q_slices, d_slices = [], []
    start = 0
    for count in split_counts(len(examples), world):
        part = examples[start:start + count]
        q0, d0 = len(queries), len(documents)
        for ex in part:
            pos_index.append(len(documents))
            documents.append(ex.positive)
        for i, ex in enumerate(part):
            for text, source in zip(ex.negatives, ex.negative_sources):
                neg_owner.append(q0 + i)
                neg_index.append(len(documents))
                neg_generated.append(source == "generated")
                documents.append(text)
        queries.extend(ex.query for ex in part)
        q_slices.append(slice(q0, len(queries)))
        d_slices.append(slice(d0, len(documents)))
        start += count
    where: dict[str, list[int]] = defaultdict(list)
    for j, text in enumerate(documents):
        where[text].append(j)
    mask = torch.zeros((len(queries), len(documents)), dtype=torch.bool)
    for i, query in enumerate(queries):
        for text in positives_of.get(query, ()) | {documents[pos_index[i]]}:
            for j in where.get(text, ()):
                mask[i, j] = True
        mask[i, pos_index[i]] = False
    targets = BatchTargets(pos_index=torch.tensor(pos_index, dtype=torch.long), mask=mask,
                           neg_owner=torch.tensor(neg_owner, dtype=torch.long),
                           neg_index=torch.tensor(neg_index, dtype=torch.long),
                           neg_generated=torch.tensor(neg_generated, dtype=torch.bool))
    return BatchLayout(queries, documents, targets, q_slices, d_slices)
