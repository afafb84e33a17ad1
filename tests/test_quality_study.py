"""bench/quality_scifact.py's results export: a run folder's row files become docs/results/scifact_minilm.json, and
``--merge`` keeps what an earlier export recorded when its run folder is gone (a new machine), without letting a
rerun silently replace a recorded (row, seed)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "quality_scifact.py"


def load_study():
    spec = importlib.util.spec_from_file_location("quality_scifact", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_row(out: Path, key: str, steps: int = 42, **values) -> None:
    (out / "rows").mkdir(parents=True, exist_ok=True)
    settings = {"scifact": "/abs/scifact", "out": str(out), "biosses": "/abs/biosses"}
    (out / "rows" / f"{key}.json").write_text(json.dumps(
        {**values, "settings": settings, "command": f"python bench/quality_scifact.py --scifact /abs/scifact "
                                                    f"--out {out} --rows {key.rpartition('_s')[0]} --seeds 1",
         "steps": steps, "train_seconds": 10, "eval_seconds": 5}))


def recorded_export(tmp_path: Path, rows: dict[str, dict]) -> Path:
    """An earlier session's export: its run folder's rows (key -> values) written, exported, the folder gone."""
    old = tmp_path / "old"
    for key, values in rows.items():
        write_row(old, key, **values)
    recorded = tmp_path / "results.json"
    load_study().export(load_study().collect(old), recorded)
    return recorded


def test_export_then_merge_round_trips_and_keeps_recorded_results(tmp_path, capsys):
    study = load_study()
    old = tmp_path / "old"
    write_row(old, "bm25_s1", dev_ndcg10=0.72, test_ndcg10=0.68, test_recall100=0.94, biosses=0.81)
    write_row(old, "bm25_s2", dev_ndcg10=0.74, test_ndcg10=0.70, test_recall100=0.95, biosses=0.83)
    recorded = tmp_path / "results.json"
    objects = study.export(study.collect(old), recorded)
    (bm25,) = objects
    assert bm25["seeds"] == [1, 2] and bm25["dev_ndcg10"] == {"1": 0.72, "2": 0.74} and bm25["dev_ndcg10_mean"] == 0.73
    assert "--seeds 1 2" in bm25["command"] and "/abs/scifact" not in bm25["command"]  # portable, both seeds

    # the old folder is gone; a new one reruns bm25 seed 1 (different number) and adds a new row
    new = tmp_path / "new"
    write_row(new, "bm25_s1", dev_ndcg10=0.7, biosses=0.8)
    write_row(new, "inbatch_s1", dev_ndcg10=0.69, biosses=0.82)
    rows = study.merged_rows(new, recorded)
    assert rows["bm25"][1]["dev_ndcg10"] == 0.72 and rows["bm25"][1]["test_ndcg10"] == 0.68  # recorded kept
    assert rows["inbatch"][1]["dev_ndcg10"] == 0.69
    assert "bm25 seed 1: kept the recorded result" in capsys.readouterr().out  # the rerun is shown, not dropped
    merged = study.export(rows, tmp_path / "merged.json")
    assert [o["name"] for o in merged] == ["bm25", "inbatch"]
    assert merged[0] == bm25  # re-exporting a recorded row changes nothing in it


def test_merge_from_the_command_line_writes_json_and_plot(tmp_path):
    out = tmp_path / "out"
    write_row(out, "inbatch_s3", dev_ndcg10=0.7069, biosses=0.82)
    recorded = tmp_path / "results.json"
    recorded.write_text(json.dumps([{"name": "offshelf", "kind": "baseline", "config": {}, "command": "c",
                                     "seeds": [0], "dev_ndcg10": {"0": 0.69}, "test_ndcg10": {"0": 0.6451},
                                     "test_recall100": {"0": 0.925}, "biosses": {"0": 0.8125}, "steps": 0,
                                     "wall_seconds_per_stage": None, "counts": None}]))
    subprocess.run([sys.executable, SCRIPT, "--out", out, "--merge", recorded, "--export", tmp_path / "x.json",
                    "--plot", tmp_path / "x.png"], check=True, capture_output=True)
    exported = json.loads((tmp_path / "x.json").read_text())
    assert [(o["name"], o["dev_ndcg10"]) for o in exported] == [("offshelf", {"0": 0.69}), ("inbatch", {"3": 0.7069})]
    assert exported[0]["test_ndcg10"] == {"0": 0.6451}
    assert (tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


def test_merge_adds_a_reruns_test_numbers_only_when_it_reproduces_the_recorded_model(tmp_path, capsys):
    """A dev row chosen for test after its folder was lost is retrained: its test numbers join the recorded dev
    number only when the rerun's dev number says it is the same model; otherwise the rerun is used whole."""
    study = load_study()
    recorded = recorded_export(tmp_path, {"bm25_conf_s1": dict(dev_ndcg10=0.7230, biosses=0.81),
                                          "bm25_conf_s2": dict(dev_ndcg10=0.7210, biosses=0.82)})
    new = tmp_path / "new"
    write_row(new, "bm25_conf_s1", dev_ndcg10=0.72301, test_ndcg10=0.69, test_recall100=0.95, biosses=0.81)
    write_row(new, "bm25_conf_s2", dev_ndcg10=0.7150, test_ndcg10=0.68, test_recall100=0.94, biosses=0.80)
    rows = study.merged_rows(new, recorded)["bm25_conf"]
    assert (rows[1]["dev_ndcg10"], rows[1]["test_ndcg10"], rows[1]["test_recall100"]) == (0.7230, 0.69, 0.95)
    assert (rows[2]["dev_ndcg10"], rows[2]["test_ndcg10"], rows[2]["biosses"]) == (0.7150, 0.68, 0.80)
    out = capsys.readouterr().out
    assert "bm25_conf seed 1: the rerun reproduces dev_ndcg10" in out
    assert "bm25_conf seed 2: the rerun does not reproduce the recorded dev_ndcg10" in out


def test_merge_keeps_a_row_trained_for_other_steps_as_its_own_row(tmp_path, capsys):
    """``--steps 84`` in its own --out folder: its bm25_conf is not the recorded 42-step bm25_conf (not merged into
    it, not replacing it) but ``bm25_conf@84``, a baseline stays a baseline, and exporting twice changes nothing."""
    study = load_study()
    recorded = recorded_export(tmp_path, {"bm25_s1": dict(dev_ndcg10=0.7211, biosses=0.81),
                                          "bm25_conf_s1": dict(dev_ndcg10=0.7230, biosses=0.82)})
    longer = tmp_path / "quality_84"
    write_row(longer, "bm25_conf_s1", steps=84, dev_ndcg10=0.7350, test_ndcg10=0.71, test_recall100=0.95, biosses=0.80)
    write_row(longer, "bm25_s1", steps=42, dev_ndcg10=0.7211, biosses=0.81)  # same budget: the same row
    rows = study.merged_rows(longer, recorded)
    assert sorted(rows) == ["bm25", "bm25_conf", "bm25_conf@84"]
    assert rows["bm25_conf"][1]["dev_ndcg10"] == 0.7230 and rows["bm25_conf"][1].get("test_ndcg10") is None
    assert rows["bm25_conf@84"][1]["dev_ndcg10"] == 0.7350 and rows["bm25_conf@84"][1]["steps"] == 84
    assert "bm25 seed 1: kept the recorded result" in capsys.readouterr().out
    objects = {o["name"]: o for o in study.export(rows, tmp_path / "merged.json")}
    assert objects["bm25_conf@84"]["test_ndcg10"] == {"1": 0.71} and objects["bm25_conf@84"]["kind"] == "repair"
    assert study.is_baseline("bm25@84") and not study.is_baseline("bm25_conf@84")
    again = study.merged_rows(longer, tmp_path / "merged.json")  # the next export, from the same folder
    assert sorted(again) == sorted(rows) and again["bm25_conf@84"][1]["dev_ndcg10"] == 0.7350


def test_bm25_conf_takes_lever_3_tuples_from_a_finished_seed_and_refuses_without_one(tmp_path):
    study = load_study()
    s = study.Study.__new__(study.Study)
    s.out = tmp_path
    try:
        s.lever3_tuples(2)
        raise AssertionError("no lever-3 run: must refuse")
    except SystemExit as e:
        assert "run the repair_conf_only row through step 09 first" in str(e)
    for other in (10, 3):  # the lowest finished seed, by number
        run = tmp_path / "repair" / f"repair_conf_only_s{other}"
        (run / ".state").mkdir(parents=True)
        (run / ".state" / "iter1.09_consistency.done").write_text("0\n")
    assert s.lever3_tuples(2) == run / "iter1" / "differentiation" / "final_train_data.bottom_30pct.jsonl"
    own = tmp_path / "repair" / "repair_conf_only_s2" / ".state"
    own.mkdir(parents=True)
    (own / "iter1.09_consistency.done").write_text("0\n")
    assert s.lever3_tuples(2).parts[-4] == "repair_conf_only_s2"  # its own seed's run first


def test_a_driver_run_reads_the_studys_cached_vectors_through_links(tmp_path):
    """share_embeddings: the driver's cache finds every vector the study's evaluations wrote, and its own writes stay
    out of the study's cache."""
    import numpy as np

    from repair.encoding import EmbeddingCache, text_key

    study = load_study()
    s = study.Study.__new__(study.Study)
    s.out = tmp_path
    keys = [text_key(t) for t in ("doc one", "doc two", "doc three")]
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    EmbeddingCache(tmp_path / "cache", "fp1", meta={"m": 1}).put(keys[:2], vectors[:2])
    EmbeddingCache(tmp_path / "cache", "fp1").put(keys[2:], vectors[2:])
    run_dir = tmp_path / "repair" / "row_s1"
    s.share_embeddings(run_dir)
    s.share_embeddings(run_dir)  # idempotent
    seen = EmbeddingCache(run_dir / "cache" / "embeddings", "fp1")
    assert len(seen) == 3 and np.array_equal(seen.get(keys), vectors)
    seen.put([text_key("driver only")], np.ones((1, 4), dtype=np.float32))
    assert len(EmbeddingCache(tmp_path / "cache", "fp1")) == 3


def test_a_lever_row_reusing_stages_copies_exactly_the_files_each_shared_step_recorded(tmp_path):
    """reuse_repair_stages copies a shared step's files as the driver recorded them (``$STATE/<step>.outputs``),
    wherever the step wrote: a row sharing up to 07 or 08 with repair_conf_only gets 06b's confused_tuples (in
    differentiation/, beside 08's and 09's files) with 06b's marker, 08's output only when 08 is shared, never 09's,
    and no file no shared step recorded; iteration 0's steps (a warm start, T0's BM25 negatives) come before any
    shared step, so they are copied too. A source run without records is refused, naming the steps."""
    study = load_study()
    s = study.Study.__new__(study.Study)
    s.out = tmp_path
    src = tmp_path / "repair" / "repair_conf_only_s1"
    (src / ".state").mkdir(parents=True)
    recorded = {"iter0.eval": ["iter0/eval/eval.json"], "t0.bm25_negatives": ["t0_negatives/t0_bm25.jsonl"],
                "iter0.10_warm_start": ["iter0/adapter/model.safetensors"],  # WARM_START=1: before iteration 1
                "iter1.04_merge": ["iter1/diagnosis/PathAB_terms/final_terms.bottom_30pct.txt"],
                "iter1.06b_confused": ["iter1/differentiation/confused_tuples.bottom_30pct.jsonl",
                                       "iter1/differentiation/confused_tuples.bottom_30pct.stats.json"],
                "iter1.07_embed": ["iter1/differentiation/embeddings/documents.npy"],
                "iter1.08_hardneg": ["iter1/differentiation/hard_negatives.bottom_30pct.jsonl"],
                "iter1.09_consistency": ["iter1/differentiation/final_train_data.bottom_30pct.jsonl"]}
    for step, files in recorded.items():
        for f in files:
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_text(f)
        (src / ".state" / f"{step}.outputs").write_text("".join(f + "\n" for f in files))
        (src / ".state" / f"{step}.done").write_text("0\n")
    (src / "iter1" / "differentiation" / "stray.jsonl").write_text("no step wrote this")
    for upto, hard_negatives in (("07", False), ("08", True)):
        run_dir = tmp_path / "repair" / f"row{upto}_s1"
        assert s.reuse_repair_stages(1, run_dir, upto, "repair_conf_only")
        got = run_dir / "iter1" / "differentiation"
        copied = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()
                        and p.parts[-2] != ".state" and p.name != "REUSED_FROM")
        assert copied == sorted(f for step, files in recorded.items() for f in files
                                if step.startswith(("iter0.", "t0.")) or step.split(".")[1][:2] <= upto)
        assert (got / "confused_tuples.bottom_30pct.jsonl").read_text() == recorded["iter1.06b_confused"][0]
        assert (got / "hard_negatives.bottom_30pct.jsonl").exists() is hard_negatives
        assert not (got / "final_train_data.bottom_30pct.jsonl").exists() and not (got / "stray.jsonl").exists()
        assert (run_dir / ".state" / "iter1.06b_confused.done").exists()
        assert (run_dir / ".state" / "iter1.06b_confused.outputs").exists()  # a reuse of this row reuses it again
        assert (run_dir / ".state" / "iter1.08_hardneg.done").exists() is hard_negatives
        assert not (run_dir / ".state" / "iter1.09_consistency.done").exists()
        assert not s.reuse_repair_stages(1, tmp_path / "repair" / "other_s1", "eval", "repair_conf_only")  # not done
    (src / ".state" / "iter1.07_embed.outputs").unlink()
    with pytest.raises(SystemExit, match=r"repair_conf_only_s1: steps iter1.07_embed have no .outputs record"):
        s.reuse_repair_stages(1, tmp_path / "repair" / "row_s2", "08", "repair_conf_only")
    assert not (tmp_path / "repair" / "row_s2").exists()


def test_a_seed_free_row_copies_one_seeds_generation_and_stage_iii_but_never_its_training(tmp_path):
    """repair_conf_d2q fixes GEN_SEED, so nothing before training takes the seed: seed 2's run copies another seed's
    steps up to 09 (the doc2query generation included) with their markers, not its training or evaluation, and
    says where they came from; seeds are found in numerical order, and a seed is never its own source. Iteration 0's
    trainings take the seed, so another seed's warm start is not copied."""
    study = load_study()
    s = study.Study.__new__(study.Study)
    s.out = tmp_path
    assert s.seed_free_source("repair_conf_d2q", 2) is None  # no run yet: seed 2 writes its own
    recorded = {"iter0.eval": "iter0/eval/eval.json",
                "iter1.06b_confused": "iter1/differentiation/confused_tuples.bottom_30pct.jsonl",
                "iter1.06c_doc2query": "iter1/expansion/expansion.doc2query.bottom_30pct.jsonl",
                "iter1.09_consistency": "iter1/differentiation/final_train_data.bottom_30pct.jsonl",
                "iter1.10_train": "iter1/adapter/adapter_model.safetensors", "iter1.eval": "iter1/eval/eval.json",
                "iter0.10_warm_start": "iter0/adapter/model.safetensors", "t0.bm25_negatives": "t0_negatives/t0_bm25.jsonl"}
    for seed in (10, 3):  # s3 finished 09, s10 too; s5 only started
        src = tmp_path / "repair" / f"repair_conf_d2q_s{seed}"
        (src / ".state").mkdir(parents=True)
        for step, f in recorded.items():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_text(f"{step} of seed {seed}")
            (src / ".state" / f"{step}.outputs").write_text(f + "\n")
            (src / ".state" / f"{step}.done").write_text("0\n")
    (tmp_path / "repair" / "repair_conf_d2q_s5" / ".state").mkdir(parents=True)
    assert s.seeds_done("repair_conf_d2q", "09_consistency") == [3, 10]
    assert (s.seed_free_source("repair_conf_d2q", 2), s.seed_free_source("repair_conf_d2q", 3)) == (3, 10)
    assert s.seed_free_source("repair_conf_only", 2) is None  # not a seed-free row: its seeds each run their own
    run_dir = tmp_path / "repair" / "repair_conf_d2q_s2"
    assert s.reuse_repair_stages(2, run_dir, "09", "repair_conf_d2q", source_seed=3)
    for step, f in recorded.items():
        # a warm start takes the training seed: another seed's is never copied
        copied = step not in ("iter1.10_train", "iter1.eval", "iter0.10_warm_start", "t0.bm25_negatives")
        assert (run_dir / f).exists() is copied, step
        assert (run_dir / ".state" / f"{step}.done").exists() is copied, step
    assert (run_dir / recorded["iter1.06c_doc2query"]).read_text() == "iter1.06c_doc2query of seed 3"
    assert "repair_conf_d2q_s3: iteration 0 eval and iteration 1 steps up to 09" in (run_dir / "REUSED_FROM").read_text()


def test_lever_4_rows_and_their_controls_refuse_to_start_without_the_baseline_model_they_continue(tmp_path):
    """A row that starts from a baseline's model (repair_conf_bm25_from_bm25, bm25_cont, inbatch_cont) names the row
    to run first and the folder it looked in, before any work (no run folder, no mined data)."""
    study = load_study()
    s = study.Study.__new__(study.Study)
    s.out = tmp_path
    for call, row in ((lambda: s.variant("repair_conf_bm25_from_bm25", 3), "bm25"), (lambda: s.bm25_cont(3), "bm25"),
                      (lambda: s.inbatch_cont(3), "inbatch")):
        with pytest.raises(SystemExit, match=f"run the {row} row for seed 3 first \\({tmp_path}/train/{row}_s3\\)"):
            call()
    assert not (tmp_path / "repair").exists() and not (tmp_path / "data").exists()
    assert study.VARIANTS["repair_conf_bm25_from_bm25"].settings["T0_NEGATIVES"] == "bm25"
    assert "bm25_cont" in study.BASELINE_ROWS


def test_compare_reports_paired_per_seed_differences_and_the_bar_at_equal_steps_only(tmp_path):
    """--compare: the candidate's mean and per-seed (paired) test differences against each baseline, read from the row
    files and a recorded export, and the +0.01 verdict; a baseline of other steps is marked, an unknown row refused."""
    study = load_study()
    recorded = recorded_export(tmp_path, {"bm25x2_s1": dict(steps=84, dev_ndcg10=0.733, test_ndcg10=0.713)})
    out = tmp_path / "out"
    for seed, (cand, cont) in enumerate([(0.722, 0.714), (0.718, 0.708), (0.719, 0.707)], start=1):
        write_row(out, f"repair_conf_bm25_from_bm25_s{seed}", steps=84, dev_ndcg10=0.73, test_ndcg10=cand)
        write_row(out, f"bm25_cont_s{seed}", steps=84, dev_ndcg10=0.73, test_ndcg10=cont)
    write_row(out, "bm25_s1", steps=42, dev_ndcg10=0.72, test_ndcg10=0.687)
    # per-claim nDCG@10 of seeds 1 and 2 (evaluation files as eval_suite writes them); seed 3 has none
    per_claim = {"repair_conf_bm25_from_bm25": [{"a": 1.0, "b": 0.5, "c": 0.0, "d": 0.6},
                                                {"a": 1.0, "b": 0.7, "c": 0.2, "d": 0.6}],
                 "bm25_cont": [{"a": 0.5, "b": 0.5, "c": 0.1, "d": 0.6}, {"a": 0.7, "b": 0.5, "c": 0.3, "d": 0.6}]}
    (out / "eval").mkdir()
    for row, by_seed in per_claim.items():
        for seed, values in enumerate(by_seed, start=1):
            (out / "eval" / f"{row}_s{seed}.test.json").write_text(json.dumps({"results": [
                {"dataset": "scifact", "per_query": {"ndcg@10": values}}, {"dataset": "biosses"}]}))
    text = study.paired_comparison(study.merged_rows(out, recorded), "repair_conf_bm25_from_bm25",
                                   ["bm25x2", "bm25_cont", "bm25"], eval_dir=out / "eval")
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| bm25")}
    # candidate mean 0.7197; bm25_cont mean 0.7097 -> +0.0100 (>= 0.01); bm25x2 one seed 0.713 -> +0.0067
    assert "| +0.0067 | s1 +0.0090 | no | – |" in lines["bm25x2"]
    # per claim, averaged over seeds 1-2: a +0.4, b +0.1, c -0.1, d 0: 2 better, 1 worse; of the 8 sign patterns of
    # (0.4, 0.1, -0.1), 6 reach |sum| >= 0.4 (all but 0.4 - 0.1 - 0.1 and its negation): p = 6/8
    from repair.metrics import paired_randomization_p
    p = paired_randomization_p([0.4, 0.1, -0.1, 0.0])
    assert p == pytest.approx(0.75, abs=0.02)
    assert f"s1 +0.0080, s2 +0.0100, s3 +0.0120 | yes | s1,2: 2 better / 1 worse of 4, p {p:.3f} |" in lines["bm25_cont"]
    assert lines["bm25"].endswith("| yes (other steps) | – |")
    assert text.startswith("repair_conf_bm25_from_bm25: seeds 1, 2, 3, steps 84, test nDCG@10 0.7197 ± 0.0021")
    with pytest.raises(SystemExit, match="no row named st_minedx2"):
        study.paired_comparison(study.merged_rows(out, recorded), "repair_conf_bm25_from_bm25", ["st_minedx2"])


def test_every_lever_row_is_a_valid_driver_configuration_sharing_from_a_known_row(tmp_path):
    """Each VARIANTS row is run_repair.sh settings: every name is a driver setting and the driver's own validation
    accepts the values on a real T0 folder (a typo would only surface an hour into a study run), and a row that
    copies stages names a step and another lever row that exists. A row verifying through SciFact's on-disk index
    (issue 41) gets a real index, of the tiny slice, where the study would build SciFact's."""
    from repair.models import ALIASES
    from repair.driver.settings import resolve, validate
    from repair.driver.settings_table import SETTINGS
    from repair.expansion.sources.literature import build_index

    study = load_study()
    known = {s.name for s in SETTINGS}
    tiny = str(ROOT / "data" / "demo" / "scifact-tiny")
    index = tmp_path / "index"
    for row, variant in study.VARIANTS.items():
        settings = study.variant_settings(row, "http://127.0.0.1:8080/v1")  # what Study.variant passes the driver
        if settings.get("LITERATURE_INDEX") == study.SCIFACT_INDEX:  # Study.variant's substitution
            if not index.exists():
                build_index([tiny], index, progress=False)
            settings["LITERATURE_INDEX"] = str(index)
        assert set(settings) <= known, (row, set(settings) - known)
        env = {"TRAIN_DATA": tiny, **settings}
        assert validate(resolve(env, ROOT), env, check_installed=False) == [], row
        if "GEN_MODEL" in settings:  # an offline alias (GENERATORS=1), not a hub id this machine cannot download
            assert settings["GEN_MODEL"] in ALIASES, row
        upto, _, source = (variant.shared or "").partition(":")
        assert upto == "" or upto in study.SHARED_UPTO, row
        assert source == "" or source in study.VARIANTS, row
        if source:  # iteration 0 is copied with any shared step, so the source must run the same iteration 0
            theirs = study.VARIANTS[source].settings
            iter0 = ("WARM_START", "SCHEDULE", "ITER_STEPS") + (("T0_NEGATIVES",) if settings.get("WARM_START") else ())
            assert all(settings.get(k) == theirs.get(k) for k in iter0), (row, source)
        assert variant.start == "offshelf" or variant.start in study.BASELINE_ROWS, row
        assert variant.budget in ("steps", "claims", "driver"), row
        # a row whose seeds share the steps before training must fix the generation's seed (else they would differ)
        assert variant.seed_free is None or (variant.seed_free in study.SHARED_UPTO and "GEN_SEED" in settings), row
    with pytest.raises(SystemExit, match="repair_qwen_gen: needs --served_generator URL"):
        study.variant_settings("repair_qwen_gen", None)
    assert study.VARIANTS["repair_qwen15_gen"].settings == {**study.VARIANTS["repair_qwen05_gen"].settings,
                                                             "GEN_MODEL": "qwen2.5-coder-1.5b"}
    # issue 43 (c): the dev-chosen REPAIR row with Stage II on, plus the dev-chosen hard form's own settings, nothing else
    one, hard_gen = study.VARIANTS["repair_conf_bm25_one"].settings, study.VARIANTS["repair_conf_hard_gen"].settings
    stage2 = {k: hard_gen[k] for k in ("GEN_ROUND", "QUERY_FORM", "HARD_TUPLES", "HARD_MARGIN")}
    assert study.VARIANTS["repair_conf_bm25_one_hard_gen"].settings == {
        **{k: v for k, v in one.items() if k != "EXPANSION"}, **stage2}
    # issue 43 on the decoder path: the title-form hard row with the form MiniLM's dev chose, nothing else changed
    assert study.VARIANTS["repair_conf_one_hard_gen"].settings == {
        **study.VARIANTS["repair_conf_one_hard"].settings, "QUERY_FORM": hard_gen["QUERY_FORM"]}


def test_pair_reads_paired_differences_from_recorded_exports_on_test_else_dev(tmp_path):
    """--pair: candidate minus baseline per seed, read from an export: on test where both rows have it, on dev for a
    row dev rejected (no test numbers), BIOSSES beside; rows of other steps refused; the plot is a PNG."""
    study = load_study()
    recorded = recorded_export(tmp_path, {
        "repair_conf_one_s1": dict(steps=64, test_ndcg10=0.7258, biosses=0.7904),
        "repair_conf_one_s2": dict(steps=64, test_ndcg10=0.7614, biosses=0.8009),
        "inbatch2x_s1": dict(steps=64, test_ndcg10=0.7328, biosses=0.8006),
        "inbatch2x_s2": dict(steps=64, test_ndcg10=0.7394, biosses=0.7674),
        "inbatch2x_s3": dict(steps=64, test_ndcg10=0.74, biosses=0.78),   # a seed the candidate lacks: not paired
        "d2q_s1": dict(dev_ndcg10=0.7157, biosses=0.8190), "conf_only_s1": dict(dev_ndcg10=0.7211, test_ndcg10=0.68,
                                                                                  biosses=0.8270),
        "bm25_s1": dict(steps=84, dev_ndcg10=0.72, biosses=0.81)})
    one, d2q = study.paired_panels([(str(recorded), "repair_conf_one", "inbatch2x"),
                                    (str(recorded), "d2q", "conf_only")])
    assert one["split"] == "test" and one["steps"] == "64" and list(one["ndcg10"]) == [1, 2]
    assert one["ndcg10"][1] == pytest.approx(-0.0070) and one["ndcg10"][2] == pytest.approx(0.0220)
    assert one["biosses"][2] == pytest.approx(0.0335)
    assert d2q["split"] == "dev" and d2q["ndcg10"] == {1: pytest.approx(-0.0054)}
    table = study.paired_table([one, d2q])
    assert "| repair_conf_one − inbatch2x | results.json | 64 | test | s1 -0.0070, s2 +0.0220 | +0.0075 |" in table
    with pytest.raises(SystemExit, match="not at equal steps"):
        study.paired_panels([(str(recorded), "d2q", "bm25")])
    with pytest.raises(SystemExit, match="no row named nope"):
        study.paired_panels([(str(recorded), "nope", "bm25")])
    png = tmp_path / "paired.png"
    done = subprocess.run([sys.executable, SCRIPT, "--pair", recorded, "repair_conf_one", "inbatch2x",
                           "--paired_plot", png], check=True, capture_output=True, text=True)
    assert "s1 -0.0070, s2 +0.0220 | +0.0075 | s1 -0.0102, s2 +0.0335 | +0.0116 |" in done.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_per_claim_comparison_reads_a_driver_rows_own_test_evaluation_from_its_last_iteration(tmp_path):
    """The subset protocol's driver rows are evaluated on test by the driver (iter<k>/eval/eval.json), not by the bench:
    the per-claim comparison reads the file of the last iteration report.json lists, and never a driver evaluation on
    another split."""
    study = load_study()
    out = tmp_path / "out"

    def evaluation(path: Path, split: str, per_claim: dict[str, float]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"split": split, "results": [
            {"dataset": "scifact", "per_query": {"ndcg@10": per_claim}}, {"dataset": "biosses"}]}))

    run_dir = out / "repair" / "repair_conf_one_s3"

    def report(*iterations: int) -> None:
        (run_dir / "report.json").write_text(json.dumps({"iterations": [{"iter": i} for i in iterations]}))

    evaluation(out / "eval" / "inbatch2x_s3.test.json", "test", {"a": 0.5, "b": 0.5, "c": 0.5})
    evaluation(run_dir / "iter0" / "eval" / "eval.json", "test", {"a": 0, "b": 0, "c": 0})
    evaluation(run_dir / "iter1" / "eval" / "eval.json", "test",
               {"a": 1.0, "b": 0.6, "c": 0.5})
    # a stale iteration folder the report does not list (an earlier, longer run in the same place) is not the result
    evaluation(run_dir / "iter2" / "eval" / "eval.json", "test", {"a": 0, "b": 0, "c": 0})
    report(0, 1)
    assert study.per_query_test(out / "eval", "repair_conf_one", "inbatch2x", [3]).startswith(
        "s3: 2 better / 0 worse of 3, p ")
    evaluation(run_dir / "iter2" / "eval" / "eval.json", "dev", {"a": 1.0})
    report(0, 1, 2)
    assert study.per_query_test(out / "eval", "repair_conf_one", "inbatch2x", [3]) == "–"
