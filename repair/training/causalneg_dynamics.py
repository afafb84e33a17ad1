"""The CausalNeg paper's training-time negative diagnostics (Sec. 2.4 / 4.3, Fig. 3, Table 3), from a training run.

Training dynamics (from a run's ``train_log.jsonl`` and checkpoints): the mean per-negative softmax weight of
mined and generated negatives per window of steps and their ratio (Fig. 3), and, with :func:`gradient_probe`,
the per-negative parameter-gradient norm ratio (generated / mined) and the alignment of each source's gradient
with the positive's (Table 3), measured on a fixed probe batch at every checkpoint.

Separate from :mod:`.diagnostics` because it reads a training run: :func:`probe_run` rebuilds the run's model with
the trainer's own code, so this is the one module of the package that sits above :mod:`repair.training.trainer` (imported
lazily, so reading a log needs no torch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from repair.data import GENERATED, MINED, DataError, iter_jsonl, load_torch_file

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- training logs
def read_train_log(path: str | Path) -> list[dict]:
    """The trainer's ``train_log.jsonl`` rows (one per optimizer step), in step order; a partial last line (a
    killed or running trainer) is skipped."""
    rows = [r for r in iter_jsonl(path, skip_partial_last=True) if "step" in r]
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
        srcs = rec.get("negative_sources") or [MINED] * len(negs)
        if num_hard_negatives >= 0:
            negs, srcs = negs[:num_hard_negatives], srcs[:num_hard_negatives]
        gen = [s == GENERATED for s in srcs]
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

    from repair.data import read_json
    from repair.runtime import pick_device
    from repair.training.trainer import ARGS_FILE, build_retriever, list_checkpoints
    from repair.training.config import TrainConfig
    from repair.training.data import expand_paths

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
            weights = load_torch_file(ckpt / "trainable.pt")
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


