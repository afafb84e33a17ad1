"""bench/claims_moved.py: per-claim test changes of a row against its twin, grouped by how the row's Stage II tuples
use each claim's gold document (issue 43's "which claims move, up and down"). Values worked out by hand."""

import json
import math
import subprocess
import sys
from pathlib import Path

from repair.data import write_jsonl

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "claims_moved.py"


def beir(folder: Path) -> Path:
    write_jsonl(folder / "corpus.jsonl", [{"_id": f"d{i}", "title": f"t{i}", "text": f"abstract {i}"} for i in range(4)])
    write_jsonl(folder / "queries.jsonl", [{"_id": q, "text": f"claim {q}"} for q in ("1", "2", "3")])
    (folder / "qrels").mkdir(parents=True)
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\td0\t1\n2\td1\t1\n3\td3\t1\n")
    return folder


def evals(folder: Path, row: str, seed: int, scores: dict[str, float]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{row}_s{seed}.test.json").write_text(json.dumps(
        {"results": [{"dataset": "scifact", "per_query": {"ndcg@10": scores}}]}))


def test_groups_claims_by_what_stage2_taught_their_gold_document(tmp_path):
    data = beir(tmp_path / "scifact")
    run = tmp_path / "run"
    (run / "report.json").parent.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps({"iterations": [{"iter": 1}]}))
    write_jsonl(run / "iter1" / "differentiation" / "final_train_data.bottom_30pct.jsonl", [
        # Stage II: d0 taught as a positive, d1 as d- (d2 is only a later candidate: not trained on)
        {"source": "local_corpus", "pos_document": "abstract 0", "d_neg": "abstract 1",
         "hard_negatives": ["abstract 1", "abstract 2"]},
        # Q_conf's own claims do not count as Stage II
        {"source": "t0_confused", "pos_document": "abstract 3", "d_neg": "abstract 2", "hard_negatives": ["abstract 2"]}])
    ev = tmp_path / "eval"
    evals(ev, "cand", 1, {"1": 0.9, "2": 0.2, "3": 0.5})
    evals(ev, "cand", 2, {"1": 0.7, "2": 0.4, "3": 0.5})
    evals(ev, "base", 1, {"1": 0.5, "2": 0.6, "3": 0.5})
    evals(ev, "base", 2, {"1": 0.5, "2": 0.6, "3": 0.5})
    out = subprocess.run([sys.executable, str(SCRIPT), "--eval_dir", str(ev), "--candidate", "cand", "--baseline",
                          "base", "--seeds", "1", "2", "--run", str(run), "--scifact", str(data), "--top", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert "use 1 documents as positives, 1 as hard negatives" in lines[0]
    # the mean of +0.3, -0.3 and 0, and its p: every sign flip of (+0.3, -0.3) is as far from 0 as 0 is
    assert "mean over seeds [1, 2]: +0.0000, paired randomization p 1.000;" in lines[0]
    # claim 1 (gold d0, a positive): +0.3 (+0.4, +0.2); claim 2 (gold d1, d-): -0.3; claim 3 (d3: Q_conf only): 0
    # per seed, claim 1 moves +0.4 and +0.2, claim 2 -0.4 and -0.2, claim 3 not: the same way on both, r = 1
    assert lines[1] == ("the same way on every seed: 1 claims up, 1 down; two seeds' per-claim changes correlate "
                        "r +1.00 (mean over pairs of seeds)")
    assert lines[4:7] == ["| hard negative | 1 | -0.3000 | 0 | 1 |", "| positive | 1 | +0.3000 | 1 | 0 |",
                          "| – | 1 | +0.0000 | 0 | 0 |"]
    assert lines[-2:] == ["| 1 | +0.300 | positive | claim 1 |", "| 2 | -0.300 | hard negative | claim 2 |"]
    # another row beside it, seed by seed: seed 1 moves claims 1 and 3 (+0.1, 0, +0.1) against the candidate's
    # (+0.4, -0.4, 0): both up on claim 1 only; covariance 0.04 over variances 0.32 and 0.02 / 3 (sums of squares about
    # the mean), r = sqrt(3) / 2; seed 2 the same as the candidate: r = 1
    evals(ev, "other", 1, {"1": 0.6, "2": 0.6, "3": 0.6})
    evals(ev, "other", 2, {"1": 0.7, "2": 0.4, "3": 0.5})
    beside = subprocess.run([*out.args, "--other", "other"], capture_output=True, text=True, cwd=ROOT)
    assert beside.returncode == 0, beside.stderr
    assert beside.stdout.splitlines()[2:4] == [
        "seed 1, other - base beside it: 1 claims up in both, 0 down in both; per-claim changes correlate r +0.87",
        "seed 2, other - base beside it: 1 claims up in both, 1 down in both; per-claim changes correlate r +1.00"]


def test_a_driver_row_is_read_from_its_own_last_evaluation_and_only_on_the_split_asked(tmp_path):
    """The subset protocol's rows have no study evaluation file: their per-claim test numbers are the driver's own
    last evaluation (the iteration report.json lists last); an evaluation on another split is refused."""
    data = beir(tmp_path / "scifact")
    out = tmp_path / "out"

    def driver_row(name: str, split: str, scores: dict[str, float]) -> Path:
        run = out / "repair" / name
        for i, values in ((0, {q: 0.0 for q in scores}), (1, scores)):  # iteration 0 (the warm start) is not it
            path = run / f"iter{i}" / "eval" / "eval.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"split": split, "results": [
                {"dataset": "scifact", "per_query": {"ndcg@10": values}}, {"dataset": "biosses"}]}))
        (run / "report.json").write_text(json.dumps({"iterations": [{"iter": 0}, {"iter": 1}]}))
        return run

    run = driver_row("cand_s3", "test", {"1": 1.0, "2": 0.5, "3": 0.25})
    write_jsonl(run / "iter1" / "differentiation" / "final_train_data.bottom_30pct.jsonl", [
        {"source": "local_corpus", "pos_document": "abstract 0", "d_neg": "abstract 1", "hard_negatives": ["abstract 1"]}])
    driver_row("base_s3", "test", {"1": 0.5, "2": 0.5, "3": 0.5})
    command = [sys.executable, str(SCRIPT), "--eval_dir", str(out / "eval"), "--candidate", "cand", "--baseline",
               "base", "--seeds", "3", "--run", str(run), "--scifact", str(data), "--top", "1"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert "mean over seeds [3]: +0.0833," in lines[0]  # (+0.5 + 0 - 0.25) / 3: the last iteration's, not iter0's
    assert lines[3:6] == ["| hard negative | 1 | +0.0000 | 0 | 0 |", "| positive | 1 | +0.5000 | 1 | 0 |",
                          "| – | 1 | -0.2500 | 0 | 1 |"]
    driver_row("dev_s3", "dev", {"1": 0.5, "2": 0.5, "3": 0.5})
    command[command.index("base")] = "dev"
    refused = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode != 0 and "an evaluation on dev, not on test" in refused.stderr


def test_seed_agreement_counts_claims_moved_the_same_way_and_correlates_the_seeds(monkeypatch):
    """Worked by hand: changes (+1, -1, +1, 0) and (+1, +1, -1, 0) agree on claim a only and correlate
    r = -1.25 / 2.75; a third seed equal to the first adds the pairs r = 1 and r = -1.25 / 2.75 again."""
    import importlib.util

    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # claims_moved reads the study's layout from quality_scifact
    spec = importlib.util.spec_from_file_location("claims_moved", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first, second = {"a": 1.0, "b": -1.0, "c": 1.0, "d": 0.0}, {"a": 1.0, "b": 1.0, "c": -1.0, "d": 0.0}
    up, down, r = module.seed_agreement([first, second])
    assert (up, down) == (1, 0) and abs(r - (-1.25 / 2.75)) < 1e-9
    up, down, r = module.seed_agreement([first, second, dict(first)])
    assert (up, down) == (1, 0) and abs(r - (1 - 2 * 1.25 / 2.75) / 3) < 1e-9
    assert module.seed_agreement([{"a": -0.5, "b": -0.1}, {"a": -0.2, "b": -0.3}])[:2] == (0, 2)
    # a row identical to its twin on a seed moves nothing: no correlation to report, not a number
    up, down, r = module.seed_agreement([first, {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}])
    assert (up, down) == (0, 0) and math.isnan(r)
