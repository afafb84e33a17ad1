"""The CausalNeg paper's embedding-space negative diagnostics (Sec. 2.3 / 4.3, Table 5; Fig. 2 / 6).

Per negative group (``mined`` = BM25 / the input's own, ``random``, ``vanilla``, ``cot``; the group of a negative
is its trace's ``method``, else its ``negative_sources`` value):

- **mean query similarity**: mean cos(q, d-) over the group's negatives (Table 5 row 2);
- **similarity-range overlap with mined**: the share of the group's central similarity range (percentiles 5-95)
  that lies inside the mined negatives' central range (Table 5 row 4; 1.0 = inside), plus the histogram
  intersection of the two similarity distributions (1.0 = the same distribution);
- **intra-negative diversity**: the mean pairwise cosine distance (1 - cos) between negatives of the same query,
  averaged over queries with two or more of them (Table 5 row 3);
- **template-pattern ratio**: the share of negatives whose opening words (the first 4, normalised) also open a
  different negative of *another* query in the same group: the "topic introduction + background" templates of F6;
- **pure-cluster ratio**: HDBSCAN (``sklearn.cluster.HDBSCAN``) on the joint embeddings of the queries, positives,
  mined negatives and the group's negatives; the share of the group's points that fall into clusters holding only
  that group (Sec. 2.3: 24% of vanilla negatives, 3% of CoT ones); each distinct document is one point. Noise
  points are in no cluster.

Separate from :mod:`.dynamics` because it needs only a frozen encoder and the triplet files, never a training run.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from repair.data import GENERATED, MINED, DataError, iter_jsonl
from repair.tables import markdown_table

QUERY, POSITIVE = "query", "positive"
GROUP_ORDER = (MINED, "random", "vanilla", "cot", GENERATED)


# ---------------------------------------------------------------------------------------------- reading
def negative_group(source: str | None, trace) -> str:
    """The group a negative is measured in: its trace's method (bm25/input -> mined), else its source."""
    method = trace.get("method") if isinstance(trace, dict) else None
    if method in ("bm25", "input", None):
        return MINED if (source or MINED) == MINED else GENERATED
    return str(method)


@dataclass
class NegativeSet:
    """Queries, their positives and their negatives (owner = query index), deduplicated across files: the mined
    negatives shared by a mixture file and a CausalNeg file are counted once."""

    queries: list[str] = field(default_factory=list)
    positives: list[str] = field(default_factory=list)        # one per query (the first seen)
    neg_texts: list[str] = field(default_factory=list)
    neg_owner: list[int] = field(default_factory=list)
    neg_group: list[str] = field(default_factory=list)

    def groups(self) -> list[str]:
        present = set(self.neg_group)
        return [g for g in GROUP_ORDER if g in present] + sorted(present - set(GROUP_ORDER))


def read_negative_sets(paths: Sequence[str | Path], max_queries: int | None = None) -> NegativeSet:
    """Read triplet files (``query``, ``pos_document``, ``hard_negatives``[, ``negative_sources``,
    ``negative_traces``]); ``max_queries`` keeps the first N distinct queries."""
    out = NegativeSet()
    qindex: dict[str, int] = {}
    seen: set[tuple[int, str]] = set()
    for path in paths:
        for lineno, rec in iter_jsonl(path, {"query": str, "pos_document": str},
                                      {"hard_negatives": list[str], "negative_sources": list[str],
                                       "negative_traces": list}, with_lineno=True):
            negs = rec.get("hard_negatives") or []
            sources = rec.get("negative_sources") or [MINED] * len(negs)
            traces = rec.get("negative_traces") or [None] * len(negs)
            if len(sources) != len(negs) or len(traces) != len(negs):
                raise DataError(f"{path}:{lineno}: negative_sources / negative_traces are not parallel to "
                                f"hard_negatives")
            q = rec["query"].strip()
            if q not in qindex:
                if max_queries is not None and len(qindex) >= max_queries:
                    continue
                qindex[q] = len(out.queries)
                out.queries.append(q)
                out.positives.append(rec["pos_document"].strip())
            owner = qindex[q]
            for text, source, trace in zip(negs, sources, traces):
                key = (owner, " ".join(text.split()))
                if key in seen:
                    continue
                seen.add(key)
                out.neg_texts.append(text)
                out.neg_owner.append(owner)
                out.neg_group.append(negative_group(source, trace))
    if not out.neg_texts:
        raise DataError(f"{', '.join(map(str, paths))}: no hard negatives to diagnose")
    return out


# ---------------------------------------------------------------------------------------------- measures
def query_similarities(q: np.ndarray, d: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """cos(q_owner(i), d_i) for every negative i (rows are L2-normalised)."""
    return np.einsum("ij,ij->i", q[owner], d).astype(np.float64)


def range_overlap(values: np.ndarray, reference: np.ndarray, lo: float = 5.0, hi: float = 95.0) -> float:
    """Share of ``values``' central range [P_lo, P_hi] that lies inside ``reference``'s central range; a
    degenerate (zero-width) range counts 1.0 when it lies inside, else 0.0."""
    if len(values) == 0 or len(reference) == 0:
        return float("nan")
    a, b = np.percentile(values, [lo, hi])
    c, d = np.percentile(reference, [lo, hi])
    inter = max(0.0, min(b, d) - max(a, c))
    if b - a <= 0:
        return float(c <= a <= d)
    return float(inter / (b - a))


def histogram_overlap(values: np.ndarray, reference: np.ndarray, bins: int = 20) -> float:
    """Histogram intersection sum_b min(p_b, r_b) on shared bins over both ranges (1.0 = same distribution)."""
    if len(values) == 0 or len(reference) == 0:
        return float("nan")
    lo, hi = min(values.min(), reference.min()), max(values.max(), reference.max())
    if hi <= lo:
        return 1.0
    edges = np.linspace(lo, hi, bins + 1)
    p = np.histogram(values, edges)[0] / len(values)
    r = np.histogram(reference, edges)[0] / len(reference)
    return float(np.minimum(p, r).sum())


def intra_diversity(d: np.ndarray, owner: np.ndarray) -> float:
    """Mean over queries (with >= 2 negatives here) of the mean pairwise cosine distance of their negatives."""
    per_query = []
    for o in np.unique(owner):
        vecs = d[owner == o]
        m = len(vecs)
        if m < 2:
            continue
        sims = vecs @ vecs.T
        mean_sim = (sims.sum() - np.trace(sims)) / (m * (m - 1))
        per_query.append(1.0 - mean_sim)
    return float(np.mean(per_query)) if per_query else float("nan")


_WORDS = re.compile(r"[a-z0-9]+")


def template_ratio(texts: Sequence[str], owner: Sequence[int], n_words: int = 4) -> float:
    """Share of texts whose first ``n_words`` words (lower-cased, punctuation dropped) also open a *different* text
    of *another* query: repeated openings across queries are the structural templates of F6 (Table 5 row 5). The
    same corpus document mined for two queries is one text, not a template."""
    if not texts:
        return float("nan")
    seen: dict[tuple, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    keys = []
    for text, o in zip(texts, owner):
        words = _WORDS.findall(text.lower())
        head = tuple(words[:n_words]) if len(words) >= n_words else None
        body = " ".join(words)
        keys.append((head, body, int(o)))
        if head is not None:
            seen[head][body].add(int(o))
    hits = 0
    for head, body, o in keys:
        if head is None:
            continue
        if any(other != body and owners - {o} for other, owners in seen[head].items()):
            hits += 1
    return hits / len(texts)


def cluster_labels(x: np.ndarray, min_cluster_size: int = 5, min_samples: int | None = None,
                   pca_dims: int | None = None, seed: int = 0) -> np.ndarray:
    """HDBSCAN labels (-1 = noise) of L2-normalised vectors (Euclidean on the unit sphere ranks like cosine),
    optionally after PCA to ``pca_dims`` dimensions (faster and less noisy in high dimension)."""
    from sklearn.cluster import HDBSCAN

    x = np.asarray(x, dtype=np.float64)
    if pca_dims and pca_dims < min(x.shape):
        from sklearn.decomposition import PCA

        x = PCA(n_components=pca_dims, random_state=seed).fit_transform(x)
    return HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples, copy=True).fit_predict(x)


def pure_cluster_ratios(labels: np.ndarray, types: Sequence[str]) -> dict[str, float]:
    """For each type: the share of its points that sit in a cluster whose members are all of that type."""
    labels = np.asarray(labels)
    types = np.asarray(types)
    pure_clusters: dict[int, str] = {}
    for lab in np.unique(labels):
        if lab < 0:
            continue
        kinds = np.unique(types[labels == lab])
        if len(kinds) == 1:
            pure_clusters[int(lab)] = str(kinds[0])
    out = {}
    for kind in dict.fromkeys(types.tolist()):
        sel = types == kind
        in_pure = np.array([pure_clusters.get(int(lab)) == kind for lab in labels[sel]])
        out[str(kind)] = float(in_pure.mean()) if len(in_pure) else float("nan")
    return out


# ---------------------------------------------------------------------------------------------- the table
@dataclass
class EmbeddedSet:
    """A :class:`NegativeSet` with its vectors (queries in QUERY format, documents in PASSAGE format)."""

    data: NegativeSet
    q: np.ndarray
    pos: np.ndarray
    neg: np.ndarray


def embed_set(data: NegativeSet, retriever, instruction: str | None = None, show_progress: bool = True) -> EmbeddedSet:
    """Encode queries, positives and negatives with a :class:`repair.encoding.Retriever` (frozen, cached)."""
    q = retriever.encode_queries(data.queries, instruction=instruction, show_progress=show_progress).numpy()
    pos = retriever.encode_passages(data.positives, show_progress=show_progress).numpy()
    neg = retriever.encode_passages(data.neg_texts, show_progress=show_progress).numpy()
    return EmbeddedSet(data, q, pos, neg)


def _first_of_each_text(texts: Sequence[str]) -> np.ndarray:
    """Mask of the first occurrence of each distinct (whitespace-normalised) text."""
    seen: set[str] = set()
    mask = np.zeros(len(texts), dtype=bool)
    for i, text in enumerate(texts):
        key = " ".join(text.split())
        if key not in seen:
            seen.add(key)
            mask[i] = True
    return mask


def diagnose(emb: EmbeddedSet, *, min_cluster_size: int = 5, min_samples: int | None = None,
             pca_dims: int | None = None, template_words: int = 4, percentiles: tuple[float, float] = (5.0, 95.0),
             seed: int = 0) -> dict:
    """The Table 5 measures for every negative group, and the similarities / labels the plots need.

    Pure clusters of group G are computed on {queries, positives, mined negatives, G's negatives} (the paper's
    per-generation analysis), so two generated groups never hide each other's pure clusters; each distinct
    document is one point (identical vectors of a document mined for several queries would form a trivially
    pure cluster). The similarity measures are per (query, negative) pair.
    """
    data = emb.data
    owner = np.asarray(data.neg_owner)
    groups = np.asarray(data.neg_group)
    sims = query_similarities(emb.q, emb.neg, owner)
    pos_sims = np.einsum("ij,ij->i", emb.q, emb.pos)
    mined = groups == "mined"
    rows, clusters = [], {}
    unique = _first_of_each_text(data.neg_texts)  # a document mined for several queries is one point
    for g in data.groups():
        sel = groups == g
        parts = [(QUERY, emb.q), (POSITIVE, emb.pos)]
        if g != "mined" and mined.any():
            parts.append(("mined", emb.neg[mined & unique]))
        parts.append((g, emb.neg[sel & unique]))
        x = np.concatenate([v for _, v in parts])
        types = np.concatenate([[name] * len(v) for name, v in parts])
        labels = cluster_labels(x, min_cluster_size, min_samples, pca_dims, seed)
        ratios = pure_cluster_ratios(labels, types)
        clusters[g] = {"types": types, "labels": labels, "x": x, "ratios": ratios}
        rows.append({
            "group": g, "negatives": int(sel.sum()), "documents": int((sel & unique).sum()),
            "queries": int(len(np.unique(owner[sel]))),
            "mean_query_similarity": float(sims[sel].mean()),
            "std_query_similarity": float(sims[sel].std()),
            "range_overlap_with_mined": range_overlap(sims[sel], sims[mined], *percentiles) if mined.any() else None,
            "hist_overlap_with_mined": histogram_overlap(sims[sel], sims[mined]) if mined.any() else None,
            "intra_negative_diversity": intra_diversity(emb.neg[sel], owner[sel]),
            "template_pattern_ratio": template_ratio([t for t, s in zip(data.neg_texts, sel) if s], owner[sel],
                                                     template_words),
            "pure_cluster_ratio": ratios[g],
            "clusters": int(len(set(labels.tolist()) - {-1})),
            "noise_share": float((labels == -1).mean()),
        })
    return {"rows": rows, "positive_similarity": float(pos_sims.mean()), "sims": sims, "pos_sims": pos_sims,
            "groups": groups, "clusters": clusters, "n_queries": len(data.queries)}


TABLE_COLUMNS = (("group", "group", "{}"), ("negatives", "negatives", "{}"),
                 ("mean_query_similarity", "mean q-sim", "{:.3f}"),
                 ("range_overlap_with_mined", "range overlap w/ mined", "{:.3f}"),
                 ("hist_overlap_with_mined", "hist overlap w/ mined", "{:.3f}"),
                 ("intra_negative_diversity", "intra-neg diversity", "{:.3f}"),
                 ("template_pattern_ratio", "template ratio (%)", "{:.1%}"),
                 ("pure_cluster_ratio", "pure-cluster ratio (%)", "{:.1%}"))


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    text = spec.format(value)
    return text.rstrip("%") if spec.endswith("%}") else text


def diagnostics_table(rows: Sequence[dict], columns=TABLE_COLUMNS) -> str:
    """Markdown table of result rows: ``columns`` are (key, title, format spec); a missing or NaN value is "-"."""
    return markdown_table([title for _, title, _ in columns],
                          [[_fmt(r.get(key), spec) for key, _, spec in columns] for r in rows])


# ---------------------------------------------------------------------------------------------- plots
GROUP_COLORS = {QUERY: "#1f77b4", POSITIVE: "#2ca02c", "mined": "#7f7f7f", "random": "#bcbd22",
                "vanilla": "#d62728", "cot": "#9467bd", "generated": "#ff7f0e"}


def plot_similarities(result: dict, path: str | Path) -> None:
    """Fig. 2a / 6a: distributions of cos(q, d) for positives and each negative group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bins = np.linspace(min(result["sims"].min(), result["pos_sims"].min()),
                       max(result["sims"].max(), result["pos_sims"].max()), 40)
    ax.hist(result["pos_sims"], bins=bins, density=True, alpha=0.45, label="positive", color=GROUP_COLORS[POSITIVE])
    for row in result["rows"]:
        g = row["group"]
        ax.hist(result["sims"][result["groups"] == g], bins=bins, density=True, alpha=0.45, label=g,
                color=GROUP_COLORS.get(g))
    ax.set_xlabel("cos(query, document)")
    ax.set_ylabel("density")
    ax.legend()
    ax.set_title("Query similarity by document type")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_clusters(result: dict, path: str | Path, seed: int = 0) -> None:
    """Fig. 2b / 6b: a 2-D PCA view per group's joint clustering; points in pure clusters of the group are ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.decomposition import PCA

    groups = list(result["clusters"])
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.5), squeeze=False)
    for ax, g in zip(axes[0], groups):
        c = result["clusters"][g]
        xy = PCA(n_components=2, random_state=seed).fit_transform(c["x"])
        types, labels = c["types"], c["labels"]
        pure = {lab for lab in set(labels.tolist()) - {-1} if set(types[labels == lab]) == {g}}
        for t in dict.fromkeys(types.tolist()):
            sel = types == t
            ax.scatter(xy[sel, 0], xy[sel, 1], s=6, alpha=0.6, label=t, color=GROUP_COLORS.get(t))
        ring = np.isin(labels, list(pure)) & (types == g)
        ax.scatter(xy[ring, 0], xy[ring, 1], s=30, facecolors="none", edgecolors="black", linewidths=0.6,
                   label=f"{g} in pure clusters")
        ax.set_title(f"{g}: pure-cluster ratio {c['ratios'][g]:.1%}")
        ax.legend(fontsize=7, markerscale=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def to_json(obj):
    """numpy-free copy of a result for JSON (arrays dropped; they are in the plots)."""
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items() if not isinstance(v, np.ndarray)}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, float) and np.isnan(obj):
        return None
    return obj


def dump(path: str | Path, obj) -> None:
    from repair.data import write_json

    write_json(path, json.loads(json.dumps(to_json(obj), allow_nan=False, default=str)))
