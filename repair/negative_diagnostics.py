"""The CausalNeg paper's negative diagnostics (Sec. 2.3 / 4.3, Table 5; Sec. 2.4 / 4.3, Fig. 3, Table 3).

Embedding-space measurements, per negative group (``mined`` = BM25 / the input's own, ``random``, ``vanilla``,
``cot``; the group of a negative is its trace's ``method``, else its ``negative_sources`` value):

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

Training dynamics (from a run's ``train_log.jsonl`` and checkpoints): the mean per-negative softmax weight of
mined and generated negatives per window of steps and their ratio (Fig. 3), and, with :func:`gradient_probe`,
the per-negative parameter-gradient norm ratio (generated / mined) and the alignment of each source's gradient
with the positive's (Table 3), measured on a fixed probe batch at every checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .data import DataError, iter_jsonl

logger = logging.getLogger(__name__)

QUERY, POSITIVE = "query", "positive"
GROUP_ORDER = ("mined", "random", "vanilla", "cot", "generated")


# ---------------------------------------------------------------------------------------------- reading
def negative_group(source: str | None, trace) -> str:
    """The group a negative is measured in: its trace's method (bm25/input -> mined), else its source."""
    method = trace.get("method") if isinstance(trace, dict) else None
    if method in ("bm25", "input", None):
        return "mined" if (source or "mined") == "mined" else "generated"
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
            sources = rec.get("negative_sources") or ["mined"] * len(negs)
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


def markdown_table(rows: Sequence[dict], columns=TABLE_COLUMNS) -> str:
    head = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r.get(key), spec) for key, _, spec in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


# ---------------------------------------------------------------------------------------------- training logs
def read_train_log(path: str | Path) -> list[dict]:
    """The trainer's ``train_log.jsonl`` rows (one per optimizer step), in step order."""
    rows = [r for r in iter_jsonl(path) if isinstance(r, dict) and "step" in r]
    return sorted(rows, key=lambda r: r["step"])


def _mean(values: Iterable) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def weight_dynamics(rows: Sequence[dict], windows: int = 10) -> list[dict]:
    """Per window of steps: mean per-negative softmax weight of mined and generated negatives (the InfoNCE
    gradient weight of Fig. 3), their ratio (generated / mined), and the mean query similarity of each."""
    if not rows:
        return []
    out = []
    for chunk in np.array_split(np.arange(len(rows)), min(windows, len(rows))):
        part = [rows[i] for i in chunk]
        wm, wg = _mean(r.get("weight_mined") for r in part), _mean(r.get("weight_generated") for r in part)
        out.append({"step_from": part[0]["step"], "step_to": part[-1]["step"], "weight_mined": wm,
                    "weight_generated": wg, "weight_ratio": (wg / wm) if (wg is not None and wm) else None,
                    "sim_mined": _mean(r.get("sim_mined") for r in part),
                    "sim_generated": _mean(r.get("sim_generated") for r in part),
                    "qem_entropy": _mean(r.get("qem_entropy") for r in part),
                    "loss": _mean(r.get("loss") for r in part)})
    return out


# ---------------------------------------------------------------------------------------------- gradient probe
@dataclass
class ProbeExample:
    query: str
    positive: str
    negatives: list[str]
    generated: list[bool]


def probe_examples(path: str | Path, n: int, num_hard_negatives: int = -1) -> list[ProbeExample]:
    """The first ``n`` lines of a triplet file that have both mined and generated negatives: a fixed probe batch."""
    out = []
    for rec in iter_jsonl(path, {"query": str, "pos_document": str}, {"hard_negatives": list[str],
                                                                      "negative_sources": list[str]}):
        negs = rec.get("hard_negatives") or []
        srcs = rec.get("negative_sources") or ["mined"] * len(negs)
        if num_hard_negatives >= 0:
            negs, srcs = negs[:num_hard_negatives], srcs[:num_hard_negatives]
        gen = [s == "generated" for s in srcs]
        if any(gen) and not all(gen):
            out.append(ProbeExample(rec["query"], rec["pos_document"], list(negs), gen))
        if len(out) >= n:
            break
    return out


def probe_gradients(retriever, examples: Sequence[ProbeExample], temperature: float) -> dict:
    """The per-source parts of the InfoNCE gradient at the current weights, as flat vectors.

    For query i with p = softmax(s(q_i, [d+, own negatives]) / tau), the gradient of -log p+ splits exactly into
    -(1 - p+) grad s+ / tau and p_j grad s_j / tau for each negative j. With p detached we return
    ``pos`` = grad sum_i -(1 - p+_i) s+_i / tau and, per source, ``mined`` / ``generated`` = grad of the mean over
    that source's negatives of p_j s_j / tau (a per-negative gradient), so that
    grad sum_i InfoNCE_i = pos + n_mined * mined + n_generated * generated. Also returns p, the kind of each
    document (0 positive, 1 mined, 2 generated) and the counts. Trainable parameters only (all when none is).
    """
    import torch

    model = retriever.model
    params = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    was_training = model.training
    model.eval()  # no dropout: the probe must be a function of the weights only
    try:
        docs, owner, kind = [], [], []
        for i, e in enumerate(examples):
            for text, k in [(e.positive, 0)] + [(t, 2 if g else 1) for t, g in zip(e.negatives, e.generated)]:
                docs.append(text)
                owner.append(i)
                kind.append(k)
        qv = retriever.embed(retriever.collate(retriever.tokenize(retriever.format([e.query for e in examples],
                                                                                   "query"))))
        dv = retriever.embed(retriever.collate(retriever.tokenize(retriever.format(docs, "passage"))))
        owner_t = torch.tensor(owner, device=dv.device)
        kind_t = torch.tensor(kind, device=dv.device)
        s = (qv[owner_t] * dv).sum(-1) / temperature
        p = torch.zeros_like(s)
        for i in range(len(examples)):
            sel = owner_t == i
            p[sel] = torch.softmax(s[sel].detach(), dim=0)
        terms = {"pos": -((1 - p) * s)[kind_t == 0].sum(), "mined": (p * s)[kind_t == 1].mean(),
                 "generated": (p * s)[kind_t == 2].mean()}
        grads = {}
        for name, term in terms.items():
            g = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
            grads[name] = torch.cat([(x if x is not None else torch.zeros_like(w)).reshape(-1).float()
                                     for x, w in zip(g, params)])
    finally:
        for prm, flag in zip(params, flags):
            prm.requires_grad_(flag)
        model.train(was_training)
    return {**grads, "p": p.detach(), "kind": kind_t, "n_mined": int((kind_t == 1).sum()),
            "n_generated": int((kind_t == 2).sum())}


def gradient_probe(retriever, examples: Sequence[ProbeExample], temperature: float) -> dict:
    """Table 3's gradient statistics on a probe batch: the per-negative gradient-norm ratio generated / mined,
    the alignment cos(g_pos, g_gen) and cos(g_pos, g_mined), and the mean per-negative softmax weights."""
    import torch

    g = probe_gradients(retriever, examples, temperature)

    def cos(a, b) -> float:
        return float(torch.nn.functional.cosine_similarity(a, b, dim=0))

    nm, ng = float(g["mined"].norm()), float(g["generated"].norm())
    p, kind = g["p"], g["kind"]
    return {"grad_norm_mined": nm, "grad_norm_generated": ng, "grad_norm_ratio": ng / nm if nm else None,
            "align_pos_generated": cos(g["pos"], g["generated"]), "align_pos_mined": cos(g["pos"], g["mined"]),
            "weight_mined": float(p[kind == 1].mean()), "weight_generated": float(p[kind == 2].mean()),
            "probe_queries": len(examples)}


def probe_run(run_dir: str | Path, n: int = 16, device: str | None = None) -> list[dict]:
    """:func:`gradient_probe` at the start of a training run and at each of its checkpoints (Table 3 over training).

    The run's ``training_args.json`` gives the model, the triplets and the temperature; the probe batch is the
    first ``n`` triplet lines with both mined and generated negatives (as many negatives as the run used). The
    model is rebuilt as the trainer built it, then each ``checkpoints/step-N/trainable.pt`` is loaded into it.
    Keep every checkpoint (``--save_total_limit 0``) to see the whole trajectory.
    """
    import torch

    from .data import read_json
    from .runtime import pick_device
    from .train import ARGS_FILE, TrainConfig, build_retriever, list_checkpoints
    from .train_data import expand_paths

    run_dir = Path(run_dir)
    saved = read_json(run_dir / ARGS_FILE)
    fields = TrainConfig.__dataclass_fields__
    cfg = TrainConfig(**{k: v for k, v in saved.items() if k in fields and k != "output_dir"},
                      output_dir=str(run_dir))
    cfg.device, cfg.gradient_checkpointing, cfg.init_lora_weights = device, "off", True
    examples: list[ProbeExample] = []
    for path in expand_paths(cfg.triplets):
        examples += probe_examples(path, n - len(examples), cfg.num_hard_negatives)
        if len(examples) >= n:
            break
    if not examples:
        raise DataError(f"{run_dir}: none of the run's triplets ({cfg.triplets}) has both mined and generated "
                        f"negatives; nothing to probe")
    retriever, _ = build_retriever(cfg, pick_device(device))
    params = dict((name, prm) for name, prm in retriever.model.named_parameters() if prm.requires_grad)
    points = [(0, None)] + [(int(c.name.split("-")[1]), c) for c in list_checkpoints(run_dir)]
    out = []
    for step, ckpt in points:
        if ckpt is not None:
            weights = torch.load(ckpt / "trainable.pt", map_location="cpu", weights_only=True)
            if set(weights) != set(params):
                raise DataError(f"{ckpt}/trainable.pt does not hold this run's trainable parameters")
            with torch.no_grad():
                for name, prm in params.items():
                    prm.copy_(weights[name].to(prm.device, prm.dtype))
        stats = gradient_probe(retriever, examples, cfg.temperature)
        wm, wg = stats["weight_mined"], stats["weight_generated"]
        out.append({"step": step, **stats, "weight_ratio": wg / wm if wm else None})
        logger.info("%s step %d: grad-norm ratio gen/mined %.3g, cos(g+, g_gen) %.3f", run_dir.name, step,
                    stats["grad_norm_ratio"] or float("nan"), stats["align_pos_generated"])
    return out


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


def plot_dynamics(runs: dict[str, dict], path: str | Path) -> None:
    """Fig. 3: per-negative softmax weight of mined vs generated negatives over training (log scale), and the
    gradient-norm ratio generated / mined at the probed checkpoints, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in runs.items():
        w = run.get("weights") or []
        steps = [(r["step_from"] + r["step_to"]) / 2 for r in w]
        for key, style in (("weight_mined", "--"), ("weight_generated", "-")):
            vals = [r[key] for r in w]
            if any(v is not None for v in vals):
                axes[0].plot(steps, [v if v is not None else np.nan for v in vals], style, marker="o", ms=3,
                             label=f"{name}: {key.split('_')[1]}")
        probes = run.get("probes") or []
        if probes:
            axes[1].plot([p["step"] for p in probes], [p["grad_norm_ratio"] for p in probes], marker="o",
                         label=name)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("mean per-negative softmax weight")
    axes[0].legend(fontsize=7)
    axes[1].set_xlabel("checkpoint step")
    axes[1].set_ylabel("grad-norm ratio generated / mined")
    axes[1].legend(fontsize=7)
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
    from .data import write_json

    write_json(path, json.loads(json.dumps(to_json(obj), allow_nan=False, default=str)))
