"""The run report of ``run_repair.sh``: what each iteration found, produced, kept and gained.

It only reads the files the stages wrote (DESIGN 4) — nothing is recomputed — so the numbers in the
report are the numbers of the run: |Q_conf|, |C_conf|, generated / verified / kept tuples, training loss,
wall time per stage, and the eval metrics before and after every iteration, plus PNG plots of the margin
distribution per iteration and of positive vs hard-negative scores of the kept triplets. It also shortens the
stages' one-line JSON summaries on the driver's console (:func:`relay_step_output`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from repair.data import iter_jsonl, read_json
from repair.tables import markdown_table

logger = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"  # written by the driver (repair.driver.run_record.RECORD_FILE)
# fields of report.json a rewrite must not lose: a report that had them came from files that were there
KEPT_FIELDS = ("t0", "q_conf", "c_conf", "generated", "generated_accepted", "verified", "hard", "kept", "kept_rate")


class ReportError(RuntimeError):
    """The report cannot be written as asked (it would lose numbers, or PCT disagrees with the run)."""

STAGES = {"diagnosis": ("01_", "02_", "03_", "04_"), "expansion": ("05_", "06_", "06c_", "06d_"),
          "differentiation": ("06b_", "07_", "08_", "09_", "09b_counterfactual"), "training": ("10_train", "10_warm_start", "10_control"),
          "eval": ("eval",)}


def final_iteration(run_dir: str | os.PathLike) -> Path:
    """A driver run's last iteration folder, as its report.json lists them: where the run's result and final model
    are (a stale ``iter<k>`` folder of an earlier, longer run in the same place is not)."""
    report_path = Path(run_dir) / "report.json"
    report = read_json(report_path)
    iterations = report.get("iterations") if isinstance(report, dict) else None
    if not iterations:
        raise ValueError(f"{report_path}: no 'iterations' (not a finished driver run folder?)")
    return Path(run_dir) / f"iter{iterations[-1]['iter']}"


def _maybe_json(path: Path) -> Any:
    return read_json(path) if path.exists() else None


def _iter_dirs(run_dir: Path) -> list[int]:
    return sorted(int(p.name[4:]) for p in run_dir.glob("iter*") if p.name[4:].isdigit())


def _stage_seconds(run_dir: Path, k: int) -> dict[str, float]:
    """Wall seconds per stage from the driver's done-markers (each holds the step's seconds)."""
    out: dict[str, float] = {}
    for marker in (run_dir / ".state").glob(f"iter{k}.*.done"):
        step = marker.name[len(f"iter{k}."):-len(".done")]
        try:
            seconds = float(marker.read_text().strip() or 0)
        except ValueError:
            continue
        for stage, prefixes in STAGES.items():
            if step.startswith(prefixes) and not (stage == "differentiation" and step.startswith("10_train")):
                out[stage] = out.get(stage, 0.0) + seconds
                break
    return out


def _headlines(eval_json: dict | None) -> dict[str, float]:
    if not eval_json:
        return {}
    out = {}
    for row in eval_json.get("results", []):
        name = f"{row['dataset']} {row['headline']}"
        out[name] = float(row[row["headline"]])
    return out


def _train_summary(adapter_dir: Path) -> dict:
    log = adapter_dir / "train_log.jsonl"
    if not log.exists():
        return {}
    losses = [r["loss"] for r in iter_jsonl(log, skip_partial_last=True) if isinstance(r.get("loss"), (int, float))]
    if not losses:
        return {}
    tail = losses[-max(1, len(losses) // 5):]
    return {"steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1],
            "mean_loss_last_20pct": sum(tail) / len(tail), "losses": losses}


def collect(run_dir: str | Path, pct: int = 30) -> dict:
    """Everything the report shows, read from the run folder."""
    run_dir = Path(run_dir)
    pp = f"{pct:02d}"
    iterations = []
    for k in _iter_dirs(run_dir):
        it = run_dir / f"iter{k}"
        row: dict[str, Any] = {"iter": k, "eval": _headlines(_maybe_json(it / "eval" / "eval.json"))}
        control = _headlines(_maybe_json(it / "eval_control" / "eval.json"))
        if control:  # CONTROL=1: the same training on T0's data alone
            row["control_eval"] = control
        if k > 0:
            meta = _maybe_json(it / "diagnosis" / "01.train_diagnosis_meta.cos_percentile.json") or {}
            row["t0"] = (meta.get("t0") or {}).get("rows")
            row["q_conf"] = ((meta.get("percentiles") or {}).get(str(pct)) or {}).get("confused")
            row["margin_stats"] = meta.get("margin_stats")
            terms = _maybe_json(it / "diagnosis" / "PathAB_terms" / f"final_terms.bottom_{pp}pct.json") or {}
            row["c_conf"] = (terms.get("counts") or {}).get("union_total")
            rounds = it / "expansion" / f"generated.bottom_{pp}pct.jsonl.rounds.jsonl"
            if rounds.exists():
                recs = list(iter_jsonl(rounds, skip_partial_last=True))
                row["generated"] = sum(r.get("generated", 0) for r in recs)
                row["generated_accepted"] = sum(r.get("accepted", 0) for r in recs)
            expansion = it / "expansion" / f"expansion.bottom_{pp}pct.jsonl"
            if expansion.exists():
                row["verified"] = sum(1 for _ in iter_jsonl(expansion, skip_partial_last=True))
            hard = it / "expansion" / f"expansion.hard.bottom_{pp}pct.jsonl"
            if hard.exists():  # HARD_TUPLES=1 (issue 43): the verified tuples the retriever got wrong or nearly
                row["hard"] = sum(1 for _ in iter_jsonl(hard, skip_partial_last=True))
            doc2query = it / "expansion" / f"expansion.doc2query.bottom_{pp}pct.jsonl"
            if doc2query.exists():  # QUERY_FORM=doc2query: documents asked, queries written (nothing to verify)
                asked = Path(f"{doc2query}.sources.jsonl")
                row["generated"] = sum(1 for _ in iter_jsonl(asked, skip_partial_last=True)) if asked.exists() else None
                row["generated_accepted"] = sum(1 for _ in iter_jsonl(doc2query, skip_partial_last=True))
            stats = _maybe_json(it / "differentiation" / "consistency_stats.json") or {}
            row["kept"] = stats.get("kept")
            row["kept_rate"] = stats.get("kept_rate")
            row["train"] = _train_summary(it / "adapter")
            row["seconds"] = _stage_seconds(run_dir, k)
        else:
            row["seconds"] = _stage_seconds(run_dir, 0)
            if (it / "adapter").exists():  # WARM_START=1: plain fine-tuning on T0 before iteration 1
                row["train"] = _train_summary(it / "adapter")
            offshelf = _headlines(_maybe_json(it / "eval_offshelf" / "eval.json"))
            if offshelf:  # WARM_START=1: the model the run started from, before the warm start
                row["offshelf_eval"] = offshelf
        iterations.append(row)
    return {"run_dir": str(run_dir), "pct": pct, "iterations": iterations}


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return str(value)


def metrics_table(summary: dict) -> str:
    """Markdown table: one row per iteration (0 = before training), one column per eval headline."""
    names: list[str] = []
    for it in summary["iterations"]:
        names += [n for n in dict.fromkeys((*it.get("offshelf_eval", {}), *it["eval"])) if n not in names]
    if not names:
        return "(no evaluation results)"
    base = summary["iterations"][0]["eval"] if summary["iterations"] else {}

    def cells(values: dict[str, float], first: bool = False) -> list[str]:
        out = []
        for n in names:
            v = values.get(n)
            out.append(_fmt(v) + ("" if v is None or n not in base or first else f" ({v - base[n]:+.4f})"))
        return out

    rows = []
    for it in summary["iterations"]:
        offshelf = it.get("offshelf_eval")
        if offshelf:  # WARM_START=1: the off-the-shelf model, then iteration 0 = the warm-started one
            rows.append(["off the shelf (before the warm start)", *cells(offshelf, True)])
        label = "0 (warm start on T0)" if offshelf else "0 (before)"
        rows.append([label if it["iter"] == 0 else str(it["iter"]), *cells(it["eval"], it["iter"] == 0)])
        control = it.get("control_eval")
        if control:  # the plain equal-steps control (CONTROL=1) and REPAIR's gain over it
            rows.append([f"{it['iter']}: plain control, same steps", *cells(control)])
            rows.append([f"{it['iter']}: REPAIR - control",
                         *(f"{it['eval'][n] - control[n]:+.4f}" if n in it["eval"] and n in control else "–"
                           for n in names)])
    return markdown_table(["iteration", *names], rows)


def counts_table(summary: dict) -> str:
    cols = [("|T0|", "t0"), ("|Q_conf|", "q_conf"), ("|C_conf|", "c_conf"), ("generated", "generated"),
            ("accepted", "generated_accepted"), ("verified", "verified"), ("kept", "kept")]
    if any("hard" in it for it in summary["iterations"]):  # HARD_TUPLES=1: 06e's selection, between 06 and 09
        cols.insert(-1, ("hard", "hard"))
    rows = []
    for it in summary["iterations"]:
        if it["iter"] == 0:
            continue
        train = it.get("train") or {}
        loss = f"{_fmt(train.get('first_loss'))} → {_fmt(train.get('last_loss'))}" if train else "–"
        rate = it.get("kept_rate")
        rows.append([it["iter"], *(_fmt(it.get(key)) for _, key in cols),
                     _fmt(rate, 3) if rate is not None else "–", loss])
    return markdown_table(["iteration", *(c for c, _ in cols), "kept rate", "train loss first → last"], rows)


def time_table(summary: dict) -> str:
    stages = list(STAGES)
    rows = []
    for it in summary["iterations"]:
        sec = it.get("seconds") or {}
        rows.append([it["iter"], *(f"{sec[s]:.0f} s" if s in sec else "–" for s in stages),
                     f"{sum(sec.values()):.0f} s"])
    return markdown_table(["iteration", *stages, "total"], rows)


def plot(run_dir: str | Path, summary: dict) -> list[str]:
    """PNG plots next to the report; returns their file names (empty if matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plots")
        return []
    run_dir = Path(run_dir)
    pp = f"{summary['pct']:02d}"
    made = []
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for it in summary["iterations"]:
        path = run_dir / f"iter{it['iter']}" / "diagnosis" / "01.train_all_query_margins.cos.jsonl"
        if it["iter"] == 0 or not path.exists():
            continue
        margins = [r["margin_cos"] for r in iter_jsonl(path)]
        ax.hist(margins, bins=40, alpha=0.5, label=f"iteration {it['iter']} (retriever before its training)")
        drawn = True
    if drawn:
        ax.axvline(0, color="k", lw=0.8)
    made += _save_plot(plt, fig, ax, drawn, run_dir / "margins.png", "margin s(q, d+) - max s(q, d-)  (Eq. 1)",
                       "T0 queries")
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for it in summary["iterations"]:
        final = run_dir / f"iter{it['iter']}" / "differentiation" / f"final_train_data.bottom_{pp}pct.jsonl"
        if it["iter"] == 0 or not final.exists():
            continue
        pos, neg = [], []
        for rec in iter_jsonl(final):
            if isinstance(rec.get("pos_score"), (int, float)):
                pos.append(rec["pos_score"])
            scores = rec.get("hard_negative_scores") or []
            if scores and isinstance(scores[0], (int, float)):
                neg.append(scores[0])
        if pos:
            ax.hist(pos, bins=30, alpha=0.45, label=f"iter {it['iter']}: s(q_new, d+)")
        if neg:
            ax.hist(neg, bins=30, alpha=0.45, label=f"iter {it['iter']}: s(q_new, d-)")
        drawn = drawn or bool(pos or neg)
    made += _save_plot(plt, fig, ax, drawn, run_dir / "triplet_scores.png",
                       "cosine score under the retriever that selected them", "kept triplets")
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = False
    for it in summary["iterations"]:
        losses = (it.get("train") or {}).get("losses")
        if losses:
            ax.plot(range(1, len(losses) + 1), losses, label=f"iteration {it['iter']}")
            drawn = True
    made += _save_plot(plt, fig, ax, drawn, run_dir / "train_loss.png", "optimizer step", "InfoNCE loss (+ QEM)")
    return made


def _save_plot(plt, fig, ax, drawn: bool, path: Path, xlabel: str, ylabel: str) -> list[str]:
    """Label and save one figure when anything was drawn on it (``[its file name]``, else ``[]``); close it."""
    made = []
    if drawn:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        made.append(path.name)
    plt.close(fig)
    return made


def recorded_pct(run_dir: str | Path) -> int | None:
    """PCT from the driver's ``settings.json`` (None for a run folder without one)."""
    path = Path(run_dir) / SETTINGS_FILE
    if not path.exists():
        return None
    value = (read_json(path).get("settings") or {}).get("PCT")
    return int(value) if isinstance(value, (int, float)) else None


def lost_fields(old: dict, new: dict) -> list[str]:
    """Numbers the previous ``report.json`` had that a new summary no longer finds (``iter1 q_conf``, ...)."""
    new_rows = {it["iter"]: it for it in new.get("iterations", [])}
    lost = []
    for it in old.get("iterations", []):
        row = new_rows.get(it.get("iter"), {})
        for key in KEPT_FIELDS:
            if it.get(key) is not None and row.get(key) is None:
                lost.append(f"iter{it['iter']} {key}")
        for field in ("eval", "offshelf_eval"):
            for name in it.get(field) or {}:
                if name not in (row.get(field) or {}):
                    lost.append(f"iter{it['iter']} {name}" + (" (off the shelf)" if field == "offshelf_eval" else ""))
    return lost


def write_report(run_dir: str | Path, pct: int = 30, overwrite: bool = False) -> tuple[Path, dict]:
    """Write ``report.md`` (+ ``report.json`` and PNGs) into the run folder; returns its path and the data.

    A report is rebuilt from the files on disk, so reading them under the wrong PCT (or after they were
    removed) yields dashes: unless ``overwrite``, a rewrite that would lose numbers the previous report had
    raises :class:`ReportError` and leaves the old report in place."""
    run_dir = Path(run_dir)
    summary = collect(run_dir, pct)
    previous = run_dir / "report.json"
    if previous.exists() and not overwrite:
        lost = lost_fields(read_json(previous), json.loads(json.dumps(summary, default=str)))
        if lost:
            raise ReportError(f"{run_dir}: the report was not rewritten: with PCT={pct} the run's files no longer "
                              f"give {', '.join(lost[:8])}{' ...' if len(lost) > 8 else ''} (the existing "
                              f"report.json has them); --force rewrites it anyway")
    images = plot(run_dir, summary)
    parts = [f"# REPAIR run report: `{run_dir}`", "",
             "## Evaluation (headline metric per dataset; iteration 0 = the starting retriever (with WARM_START=1 "
             "the warm-started one, and the row above it the off-the-shelf model); "
             "in brackets: change from iteration 0; with CONTROL=1 each iteration also shows its plain control, "
             "the same training on T0's data alone, and REPAIR's difference from it)", "", metrics_table(summary), "",
             "## What each iteration produced", "", counts_table(summary), "",
             "generated = queries the generator wrote; accepted = those that survived cleaning; verified = "
             "tuples the literature source confirmed (top hit title = q_new, its abstract = d+); hard (HARD_TUPLES=1) = "
             "verified tuples the retriever got wrong or nearly (06e); kept = tuples "
             "that passed the consistency filter (Eq. 6) and became training triplets.", "",
             "## Wall time per stage", "", time_table(summary), ""]
    for image in images:
        parts += [f"![{image}]({image})", ""]
    for_json = json.loads(json.dumps(summary, default=str))
    for it in for_json["iterations"]:
        (it.get("train") or {}).pop("losses", None)
    path = run_dir / "report.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    (run_dir / "report.json").write_text(json.dumps(for_json, indent=1), encoding="utf-8")
    return path, summary


# ------------------------------------------------------------------------------------------ the driver's console
HASH_RE = re.compile(r"^[0-9a-f]{12,}$")


def _short_fields(prefix: str, value: Any, depth: int = 0) -> list[str]:
    """``key=value`` texts for the short scalar fields of a summary, one level of nesting deep (paths, hashes,
    lists and deeper objects stay in the log)."""
    if isinstance(value, dict):
        if depth > 1:
            return []
        out: list[str] = []
        for key, sub in value.items():
            out += _short_fields(f"{prefix}.{key}" if prefix else str(key), sub, depth + 1)
        return out
    if isinstance(value, bool):
        return [f"{prefix}={str(value).lower()}"]
    if isinstance(value, int):
        return [f"{prefix}={value}"]
    if isinstance(value, float):
        return [f"{prefix}={value:.4g}"]
    if isinstance(value, str) and value and len(value) <= 24 and "/" not in value and not HASH_RE.match(value):
        return [f"{prefix}={value}"]
    return []


def summary_line(record: dict, limit: int = 150) -> str:
    """A stage's one-line JSON summary as a short console line; its full text is in the step's log."""
    text = ""
    for field in _short_fields("", record):
        if len(text) + len(field) + 1 > limit:
            return text + " ..."
        text = f"{text} {field}" if text else field
    return text


def _as_summary(line: bytes) -> str | None:
    stripped = line.strip()
    if not (stripped.startswith(b"{") and stripped.endswith(b"}")):
        return None
    try:
        record = json.loads(stripped)
    except ValueError:
        return None
    return summary_line(record) if isinstance(record, dict) else None


def relay_step_output(step: str, src: BinaryIO, dst: BinaryIO) -> None:
    """Copy a step's output to the console as it comes, replacing each JSON summary line by ``summary: ...``.

    Reads raw chunks rather than lines, so progress bars (``\\r`` updates, no newline) still show live; only
    a line that starts with ``{`` is held until its newline to decide whether it is a summary."""
    fd = src.fileno()
    held = b""  # the start of a line that may be a JSON summary
    passing = False  # inside a line that is being copied through

    def emit(data: bytes) -> None:
        dst.write(data)
        dst.flush()

    def finish(line: bytes) -> None:
        summary = _as_summary(line)
        emit(f"  summary ({step}): {summary}\n".encode() if summary is not None else line)

    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data, held = held + chunk, b""
        while data:
            newline = data.find(b"\n")
            if passing:
                part, data = (data, b"") if newline < 0 else (data[:newline + 1], data[newline + 1:])
                emit(part)
                passing = newline < 0
            elif newline >= 0:
                finish(data[:newline + 1])
                data = data[newline + 1:]
            elif data.lstrip()[:1] in (b"{", b""):
                held, data = data, b""
            else:
                emit(data)
                data, passing = b"", True
    if held:
        finish(held)
