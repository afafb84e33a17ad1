"""The driver's settings (repair/driver/settings.py): every value checked up front with a message naming the setting,
profiles below the environment, and the record that makes a rerun with other settings refuse instead of
silently skipping every step. Real files only (profile files, BEIR folders, run folders in tmp_path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repair.data import PASSAGE_KEYS
from repair.cli import COUNT_MAX, SEED_MAX
from repair.driver.settings import (
    RECORD_FILE,
    SettingsError,
    check_and_record,
    help_text,
    resolve,
    validate,
)
from repair.driver.settings_table import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "demo" / "scifact-tiny"


def problems_for(env: dict[str, str]) -> list[str]:
    return validate(resolve(env, ROOT), env)


def test_every_numeric_enum_and_path_setting_is_checked_with_its_name():
    base = {"TRAIN_DATA": str(TINY)}
    assert problems_for(base) == []
    assert problems_for({**base, "PCT": "150"}) == ["PCT must be in 1..100, got 150"]
    assert problems_for({**base, "PCT": "0"}) == ["PCT must be in 1..100, got 0"]
    assert problems_for({**base, "PCT": "thirty"}) == ["PCT must be an integer, got 'thirty'"]
    assert problems_for({**base, "LR": "0"}) == ["LR must be > 0, got 0"]
    assert problems_for({**base, "LR": "nan"}) == ["LR must be a finite number, got 'nan'"]
    assert problems_for({**base, "CN_RATIO": "1.5"}) == ["CN_RATIO must be in (0, 1], got 1.5"]
    assert problems_for({**base, "WARMUP_RATIO": "1"}) == ["WARMUP_RATIO must be in [0, 1), got 1"]
    assert problems_for({**base, "OPENAI_EXTRA": '{"repeat_penalty": 1.2}'}) == []
    assert problems_for({**base, "OPENAI_EXTRA": "[1]"}) == ["OPENAI_EXTRA must be a JSON object, got '[1]'"]
    assert problems_for({**base, "NUM_HARD_NEG": "-2"}) == ["NUM_HARD_NEG must be in -1..2147483647, got -2"]
    assert problems_for({**base, "GEN_ROUND": "0"}) == ["GEN_ROUND must be in 1..2147483647, got 0"]
    assert problems_for({**base, "FULL_FINETUNE": "yes"}) == ["FULL_FINETUNE must be 0 or 1, got 'yes'"]
    assert problems_for({**base, "POOL": "near"}) == ["POOL must be local or global, got 'near'"]
    assert problems_for({**base, "DEVICE": "gpu"}) == ["DEVICE must be cpu, cuda, cuda:N or mps, got 'gpu'"]
    assert problems_for({**base, "DEVICE": "cuda:1"}) == []
    assert problems_for({**base, "MODEL": "./no/such/model"}) == [
        "MODEL not found: ./no/such/model (a local model folder; a Hugging Face id looks like org/name)"]
    assert problems_for({**base, "S2_KEY_FILE": "/no/keys.txt"}) == ["S2_KEY_FILE not found: /no/keys.txt"]
    assert problems_for({**base, "GROUNDING": "mp"}) == ["GROUNDING=mp needs a Materials Project key in $MP_API_KEY"]
    assert problems_for({**base, "GROUNDING": "mp", "MP_API_KEY": "k"}) == []
    assert problems_for({**base, "OPENAI_URL": "localhost:8000"}) == [
        "OPENAI_URL must be an http(s):// URL (several servers: comma-separated), got 'localhost:8000'"]
    # several servers (issue 42): each URL is checked, and named without its credentials
    assert problems_for({**base, "OPENAI_URL": "http://a:8000/v1,http://b:8000/v1"}) == []
    assert problems_for({**base, "OPENAI_URL": "http://a:8000/v1, ftp://u:pw@b:21/v1"}) == [
        "OPENAI_URL must be an http(s):// URL (several servers: comma-separated), got 'ftp://b:21/v1'"]
    assert problems_for({**base, "NNODES": "0"}) == ["NNODES must be in 1..2147483647, got 0"]
    assert problems_for({**base, "MASTER_PORT": "70000"}) == ["MASTER_PORT must be in 1..65535, got 70000"]
    # HARD_TUPLES (issue 43): its settings are bounded, and HARD_TARGET only where rounds can count hard tuples
    assert problems_for({**base, "HARD_TUPLES": "1", "HARD_MARGIN": "0.2", "HARD_TARGET": "130"}) == []
    assert problems_for({**base, "HARD_DUP": "1.5"}) == ["HARD_DUP must be in [-1, 1], got 1.5"]
    assert problems_for({**base, "HARD_BUDGET": "-1"}) == ["HARD_BUDGET must be in 0..2147483647, got -1"]
    assert problems_for({**base, "HARD_TARGET": "5"}) == [
        "HARD_TARGET counts the hard tuples of HARD_TUPLES=1: set HARD_TUPLES=1 or HARD_TARGET=0"]
    assert problems_for({**base, "HARD_TUPLES": "1", "EXPANSION": "0", "CONFUSED_TUPLES": "1"}) == [
        "HARD_TUPLES=1 selects among Stage II's verified tuples: it needs EXPANSION=1"]
    assert problems_for({**base, "HARD_TUPLES": "1", "HARD_TARGET": "5", "QUERY_FORM": "doc2query"})[0].startswith(
        "HARD_TARGET counts hard tuples in the 05 -> 06 rounds; QUERY_FORM=doc2query writes its queries after them")
    # several bad values: every one is reported at once, not the first only
    many = problems_for({**base, "PCT": "150", "EPOCHS": "1.5", "TOP_K": "3", "CONSISTENCY_K": "5"})
    assert many == ["PCT must be in 1..100, got 150", "EPOCHS must be an integer, got '1.5'",
                    "TOP_K (3) must be >= CONSISTENCY_K (5): 09 decides rank(d+) <= kappa from 08's top-k list"]


def test_paths_splits_and_computed_defaults(tmp_path):
    missing = tmp_path / "t0.jsonl"
    assert problems_for({"TRAIN_DATA": str(missing)}) == [f"TRAIN_DATA not found: {missing}"]
    assert problems_for({"TRAIN_DATA": str(TINY), "TRAIN_SPLIT": "dev"}) == [
        f"TRAIN_SPLIT='dev': {TINY / 'qrels'} has no dev.tsv (splits there: test, train)"]
    assert problems_for({"TRAIN_DATA": str(TINY), "EVAL_DATA": f"scifact:ir:{tmp_path / 'nope'}"}) == [
        f"EVAL_DATA entry not found: {tmp_path / 'nope'} (from 'scifact:ir:{tmp_path / 'nope'}')"]
    adapter = tmp_path / "not_an_adapter"
    adapter.mkdir()
    assert problems_for({"TRAIN_DATA": str(TINY), "ADAPTER": str(adapter)}) == [
        f"ADAPTER must be a LoRA adapter folder (no adapter_config.json in '{adapter}')"]
    # a JSONL T0 has no corpus to verify against: SOURCE=local needs LOCAL_CORPUS
    t0 = tmp_path / "t0.jsonl"
    t0.write_text(json.dumps({"query": "q", "positive": "p"}) + "\n")
    assert problems_for({"TRAIN_DATA": str(t0)})[0].startswith("SOURCE=local needs LOCAL_CORPUS")
    # ... and T0_NEGATIVES=bm25 nothing to mine from; a BEIR folder T0 is its own corpus
    assert problems_for({"TRAIN_DATA": str(t0), "T0_NEGATIVES": "bm25", "SOURCE": "s2"})[-1] == (
        "T0_NEGATIVES=bm25 mines T0's negatives from LOCAL_CORPUS (a BEIR folder or JSONL of papers); it defaults to "
        "TRAIN_DATA only when that is a folder")
    assert problems_for({"TRAIN_DATA": str(TINY), "T0_NEGATIVES": "bm25"}) == []
    assert problems_for({"TRAIN_DATA": str(TINY), "T0_NEGATIVES": "dense"}) == [
        "T0_NEGATIVES must be none or bm25, got 'dense'"]
    # ITER_STEPS=t0 writes each training's --max_steps: a second one in TRAIN_EXTRA would silently win
    assert problems_for({"TRAIN_DATA": str(TINY), "ITER_STEPS": "t0", "TRAIN_EXTRA": "--max_steps=9"}) == [
        "ITER_STEPS=t0 sets each training's --max_steps; TRAIN_EXTRA gives one too ('--max_steps=9'): keep one of them"]
    assert problems_for({"TRAIN_DATA": str(TINY), "ITER_STEPS": "t0", "TRAIN_EXTRA": "--save_steps 0"}) == []
    assert problems_for({"TRAIN_DATA": str(TINY), "ITER_STEPS": "steps"}) == ["ITER_STEPS must be epochs or t0, got 'steps'"]
    v = resolve({"TRAIN_DATA": str(TINY), "NEGATIVES": "causalneg", "MODEL": "minilm"}, ROOT).values
    assert (v["LOCAL_CORPUS"], v["GEN_MODEL"], v["NUM_HARD_NEG"], v["QEM_LAMBDA"]) == (str(TINY), "minilm", "-1", "0.1")
    v = resolve({"TRAIN_DATA": str(TINY)}, ROOT).values
    assert (v["NUM_HARD_NEG"], v["QEM_LAMBDA"], v["MAX_LENGTH"], v["OUT_DIR"]) == ("1", "0", "512", "runs/repair")
    # GEN_SEED: the generation's seed follows SEED unless given (then runs of several SEEDs share one generation)
    assert v["GEN_SEED"] == "42"
    assert resolve({"TRAIN_DATA": str(TINY), "SEED": "3"}, ROOT).values["GEN_SEED"] == "3"
    assert resolve({"TRAIN_DATA": str(TINY), "SEED": "3", "GEN_SEED": "1"}, ROOT).values["GEN_SEED"] == "1"
    assert problems_for({"TRAIN_DATA": str(TINY), "GEN_SEED": "one"}) == ["GEN_SEED must be an integer, got 'one'"]


def test_profiles_sit_between_defaults_and_the_environment(tmp_path):
    demo = resolve({}, ROOT)  # neither PROFILE nor TRAIN_DATA: the demo
    assert demo.profile.name == "demo"
    assert (demo.values["TRAIN_DATA"], demo.values["EVAL_DATA"]) == (str(ROOT / "data/demo/scifact-demo"),) * 2
    assert (demo.values["MAX_LENGTH"], demo.values["ITERS"], demo.values["OUT_DIR"]) == ("128", "2", "runs/demo")
    tiny = resolve({"DEMO": "tiny"}, ROOT)  # the old alias
    assert tiny.profile.name == "demo-tiny" and tiny.values["TRAIN_DATA"] == str(TINY)
    assert resolve({"PROFILE": "demo-tiny", "ITERS": "3"}, ROOT).values["ITERS"] == "3"  # the environment wins
    with pytest.raises(SettingsError, match="DEMO must be full or tiny, got 'huge'"):
        resolve({"DEMO": "huge"}, ROOT)
    with pytest.raises(SettingsError,
                       match="PROFILE must be confused \\| confused-bm25 \\| confused-bm25-one \\| confused-bm25-warm \\| demo \\| demo-confused \\| demo-tiny or a profile file, got 'fast'"):
        resolve({"PROFILE": "fast"}, ROOT)

    own = tmp_path / "mine.env"
    own.write_text("# my settings\nABOUT=my run\nTRAIN_DATA=${REPAIR_ROOT}/data/demo/scifact-tiny\n"
                   "PCT=0\nLR='3e-4'  \nMAX_LENGTH=96 # tokens\n")
    env = {"PROFILE": str(own), "MAX_LENGTH": "64"}
    mine = resolve(env, ROOT)
    assert (mine.values["TRAIN_DATA"], mine.values["LR"], mine.values["MAX_LENGTH"]) == (str(TINY), "3e-4", "64")
    assert mine.profile.about == "my run"
    # a bad value from a profile names the file and line it came from
    assert validate(mine, env) == [f"PCT must be in 1..100, got 0 (from {own}:4)"]
    own.write_text("TRAIN_DATA=x\nPCTT=20\n")
    with pytest.raises(SettingsError, match=f"{own}:2: unknown setting 'PCTT'"):
        resolve({"PROFILE": str(own)}, ROOT)


def test_every_shipped_profile_validates_and_confused_is_issue_16s_configuration():
    """A profile in configs/ is a command users run: each must pass the up-front checks as shipped (given a T0
    where it leaves TRAIN_DATA to the user), and PROFILE=confused must set the lever it is named for."""
    profiles = sorted(p.stem for p in (ROOT / "configs").glob("*.env"))
    assert profiles == ["confused", "confused-bm25", "confused-bm25-one", "confused-bm25-warm", "demo", "demo-confused",
                        "demo-tiny"]
    for name in profiles:
        env = {"PROFILE": name}
        if not resolve(env, ROOT).values["TRAIN_DATA"]:
            assert validate(resolve(env, ROOT), env)[0].startswith("TRAIN_DATA is not set")
            env["TRAIN_DATA"] = str(TINY)
        assert validate(resolve(env, ROOT), env) == [], name
    confused = resolve({"PROFILE": "confused", "TRAIN_DATA": str(TINY)}, ROOT).values
    assert {k: confused[k] for k in ("CONFUSED_TUPLES", "EXPANSION", "ITERS", "MODEL", "FULL_FINETUNE")} == {
        "CONFUSED_TUPLES": "1", "EXPANSION": "0", "ITERS": "1", "MODEL": "minilm", "FULL_FINETUNE": "1"}
    assert confused["T0_NEGATIVES"] == "none"
    best = resolve({"PROFILE": "confused-bm25", "TRAIN_DATA": str(TINY)}, ROOT).values
    assert {k: v for k, v in best.items() if v != confused[k]} == {"T0_NEGATIVES": "bm25",
                                                                  "OUT_DIR": "runs/confused-bm25"}
    # the best measured configuration: the same, started from plain BM25-negative fine-tuning on T0 (lever 4), every
    # training at T0's steps (the study's equal budget)
    warm = resolve({"PROFILE": "confused-bm25-warm", "TRAIN_DATA": str(TINY)}, ROOT).values
    assert {k: v for k, v in warm.items() if v != best[k]} == {"WARM_START": "1", "ITER_STEPS": "t0", "MINI_BATCH": "64",
                                                              "OUT_DIR": "runs/confused-bm25-warm"}
    # the same in one LR schedule (the warm start is its first half), with the plain control trained beside it
    one = resolve({"PROFILE": "confused-bm25-one", "TRAIN_DATA": str(TINY)}, ROOT).values
    assert {k: v for k, v in one.items() if v != warm[k]} == {"SCHEDULE": "one", "CONTROL": "1",
                                                             "OUT_DIR": "runs/confused-bm25-one"}
    # the demo of it: the same configuration on the shipped slice (+ BIOSSES), batch 16 and 4 epochs (12 steps a training)
    demo = resolve({"PROFILE": "demo-confused"}, ROOT).values
    assert {k: v for k, v in demo.items() if v != one[k]} == {
        "TRAIN_DATA": str(ROOT / "data/demo/scifact-demo"),
        "EVAL_DATA": f"scifact:ir:{ROOT / 'data/demo/scifact-demo'} {ROOT / 'data/biosses'}",
        "LOCAL_CORPUS": str(ROOT / "data/demo/scifact-demo"), "GLOBAL_BATCH": "16", "EPOCHS": "4",
        "OUT_DIR": "runs/demo-confused"}


def test_a_rerun_with_result_changing_settings_is_refused_naming_each(tmp_path):
    out = tmp_path / "run"
    env = {"TRAIN_DATA": str(TINY), "OUT_DIR": str(out), "LR": "1e-4", "PCT": "30"}
    check_and_record(out, resolve(env, ROOT).values, force=False)
    recorded = json.loads((out / RECORD_FILE).read_text())["settings"]
    assert (recorded["PCT"], recorded["LR"], recorded["TRAIN_DATA"]) == (30, 0.0001, str(TINY))
    # no finished step yet: a changed setting simply replaces the record (a failed first try can be fixed)
    check_and_record(out, resolve({**env, "PCT": "20"}, ROOT).values, force=False)
    assert json.loads((out / RECORD_FILE).read_text())["settings"]["PCT"] == 20
    (out / ".state").mkdir()
    (out / ".state" / "iter0.eval.done").write_text("3\n")
    env["PCT"] = "20"
    with pytest.raises(SettingsError) as err:
        check_and_record(out, resolve({**env, "PCT": "25", "MODEL": "minilm"}, ROOT).values, force=False)
    assert err.value.problems[1:3] == ["  MODEL: the run used 'smollm2-135m', now 'minilm'",
                                       "  PCT: the run used 20, now 25"]
    assert "FORCE=1" in err.value.problems[-1]
    assert json.loads((out / RECORD_FILE).read_text())["settings"]["PCT"] == 20  # a refusal writes nothing
    # the same values written differently, plumbing, and more iterations are the same run
    same = {**env, "LR": "0.0001", "DEVICE": "cpu", "BATCH_SIZE": "8", "ITERS": "3", "TRAIN_DATA": str(TINY) + "/"}
    check_and_record(out, resolve(same, ROOT).values, force=False)
    assert json.loads((out / RECORD_FILE).read_text())["settings"]["ITERS"] == 3
    # FORCE=1 redoes every step: the new settings become the record
    check_and_record(out, resolve({**env, "PCT": "25"}, ROOT).values, force=True)
    assert json.loads((out / RECORD_FILE).read_text())["settings"]["PCT"] == 25


def test_the_record_carries_no_url_credentials(tmp_path):
    url = "https://user:s3cret@llm.example:8443/v1?key=abc"
    env = {"TRAIN_DATA": str(TINY), "GENERATOR": "openai", "OPENAI_URL": url}
    check_and_record(tmp_path, resolve(env, ROOT).values, force=False)
    text = (tmp_path / RECORD_FILE).read_text()
    assert "s3cret" not in text and "abc" not in text
    assert json.loads(text)["settings"]["OPENAI_URL"] == "https://llm.example:8443/v1"
    # several servers: every one recorded without its credentials
    env["OPENAI_URL"] = f"{url},http://u2:pw2@node2:8000/v1"
    check_and_record(tmp_path, resolve(env, ROOT).values, force=True)
    text = (tmp_path / RECORD_FILE).read_text()
    assert "s3cret" not in text and "pw2" not in text
    assert json.loads(text)["settings"]["OPENAI_URL"] == "https://llm.example:8443/v1,http://node2:8000/v1"


def test_help_lists_profiles_and_their_real_values():
    text = help_text(ROOT)
    assert "  demo-tiny       configs/demo-tiny.env: the shipped tiny SciFact slice" in text
    eval_line = next(line for line in text.splitlines() if line.startswith("  EVAL_DATA "))
    # the demo evaluates on its own slice only (the old help claimed "the demo folder + data/biosses")
    assert eval_line.endswith("[none; demo data/demo/scifact-demo; demo-confused scifact:ir:data/demo/scifact-demo "
                              "data/biosses; demo-tiny data/demo/scifact-tiny]")
    # the faithful demos still evaluate on their own slice only (only demo-confused adds BIOSSES)
    per_profile = dict(seg.split(" ", 1) for seg in eval_line[eval_line.index("[") + 1:-1].split("; ")[1:])
    assert "biosses" not in per_profile["demo"] and "biosses" not in per_profile["demo-tiny"]
    assert "  PCT             bottom percentile of margins = Q_conf [30]" in text


def test_the_driver_check_needs_no_torch_and_prints_shell_assignments(tmp_path):
    code = ("import sys, runpy; sys.argv = ['x', 'resolve', '--no_record']; "
            "import repair.driver.settings as s; rc = s.main(sys.argv[1:]); "
            "print('TORCH', 'torch' in sys.modules, file=sys.stderr); sys.exit(rc)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TRAIN_DATA": str(TINY), "OUT_DIR": str(tmp_path / "r"),
           "CN_EXTRA": "--temperature 0.7 --note 'it''s'"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH False" in proc.stderr
    assert not (tmp_path / "r").exists()  # --no_record: validation only
    # the assignments survive bash's eval with quotes intact
    shown = subprocess.run(["bash", "-c", 'eval "$1"; printf "%s|%s" "$PCT" "$CN_EXTRA"', "_", proc.stdout],
                           capture_output=True, text=True)
    assert shown.stdout == "30|--temperature 0.7 --note 'it''s'"


def test_resolve_sizes_t0_and_stops_on_a_malformed_t0(tmp_path):
    """The driver takes |T0| from ``resolve`` (no python -c in bash); a malformed T0 stops it there, in a second."""
    def run(env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "repair.driver.settings", "resolve", "--root", str(ROOT), "--no_record"],
                              env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, cwd=ROOT)

    good = run({"TRAIN_DATA": str(TINY), "OUT_DIR": str(tmp_path / "run")})
    assert good.returncode == 0, good.stderr
    qrels = (TINY / "qrels" / "train.tsv").read_text().splitlines()[1:]
    assert f"T0_SIZE={len({row.split()[0] for row in qrels if row.strip()})}" in good.stdout.splitlines()
    bad = tmp_path / "t0.jsonl"
    bad.write_text('{"query": "q1", "positive": "p1"}\n{"query": "q2"}\n')
    refused = run({"TRAIN_DATA": str(bad), "OUT_DIR": str(tmp_path / "run2"), "LOCAL_CORPUS": str(TINY)})
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"TRAIN_DATA: {bad}:2: missing field 'positive' (or one of {PASSAGE_KEYS})"
    assert not (tmp_path / "run2").exists()


def test_final_retriever_line_names_the_adapters_base(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base"}))
    out = subprocess.run([sys.executable, str(ROOT / "eval" / "run_report.py"), "--final_retriever", str(adapter)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == f"final retriever: ADAPTER={adapter} on BASE=/models/base (README: loading an adapter)"
    full = subprocess.run([sys.executable, str(ROOT / "eval" / "run_report.py"), "--final_retriever", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert full.stdout.strip() == f"final retriever: the model folder {tmp_path}"


def test_t0_steps_is_the_trainers_count_of_epochs_over_t0():
    """ITER_STEPS=t0's budget comes out of the settings as T0_STEPS: EPOCHS passes over T0 at GLOBAL_BATCH, the last
    batch of each pass short (the tiny T0's 16 pairs at 5: 4 steps a pass), as the trainer counts its own epochs."""
    env = {**os.environ, "TRAIN_DATA": str(TINY), "EPOCHS": "3", "GLOBAL_BATCH": "5"}
    out = subprocess.run([sys.executable, "-m", "repair.driver.settings", "resolve", "--root", str(ROOT), "--no_record"],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines())
    assert (values["T0_SIZE"], values["T0_STEPS"]) == ("16", "12")


def _hub_snapshot(hf_home: Path, repo_id: str, files: dict[str, str]) -> None:
    """A model in the Hugging Face hub cache layout (refs/main -> snapshots/<commit>/...), as a download leaves it."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)


def test_models_are_resolved_up_front_without_weights(tmp_path):
    """Issue 32: MODEL / GEN_MODEL / NER_MODEL are resolved by the driver's check (alias, folder with a config, or a
    hub id in the cache), not 2 s later in the first step; a hub id outside the cache is refused offline."""
    hf = tmp_path / "hf"
    offline = {"TRAIN_DATA": str(TINY), "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf)}
    online = {"TRAIN_DATA": str(TINY), "HF_HOME": str(hf)}
    cache = hf / "hub"
    assert problems_for({**offline, "MODEL": "Qwen/Qwen2.5-0.5B"}) == [
        f"MODEL: 'Qwen/Qwen2.5-0.5B' is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 forbids "
        f"downloading it (download it first with network, or use a local folder or an alias: minilm, "
        f"qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m)"]
    # online, an uncached hub id is looked up once on the hub (tests/test_upfront_checks.py: a server on 127.0.0.1)
    _hub_snapshot(hf, "Qwen/Qwen2.5-0.5B", {"config.json": '{"model_type": "qwen2"}'})
    assert problems_for({**offline, "MODEL": "Qwen/Qwen2.5-0.5B"}) == []  # cached: fine offline
    assert problems_for({**online, "MODEL": "no such model!"}) == [
        "MODEL not found: no such model! (an alias, a local model folder, or a Hugging Face id like org/name)"]
    empty = tmp_path / "empty_folder"
    empty.mkdir()
    assert problems_for({**online, "MODEL": str(empty)}) == [
        f"MODEL: '{empty}' is not a model folder (no config.json) nor a LoRA adapter folder (no adapter_config.json)"]
    # an adapter folder given as MODEL stands for its base, which is checked the same way
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/uncached"}))
    assert problems_for({**offline, "MODEL": str(adapter)}) == [
        f"MODEL: the base of adapter {adapter}: 'org/uncached' is not in the Hugging Face cache ({cache}) and "
        f"HF_HUB_OFFLINE=1 forbids downloading it (download it first with network, or use a local folder or an "
        f"alias: minilm, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m)"]
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "smollm2-135m"}))
    assert problems_for({**offline, "MODEL": str(adapter)}) == []
    # GEN_MODEL is a model for the hf generator, a served model's name for openai; NER_MODEL only for matdetector
    assert problems_for({**offline, "GEN_MODEL": "org/gen"})[0].startswith("GEN_MODEL: 'org/gen' is not in the")
    assert problems_for({**offline, "GEN_MODEL": "org/gen", "GENERATOR": "openai",
                         "OPENAI_URL": "http://127.0.0.1:1/v1"}) == []
    assert problems_for({**offline, "EXTRACTOR": "matdetector"})[0].startswith(
        "NER_MODEL: 'yerim0210/MatDetector' is not in the Hugging Face cache")
    assert problems_for({**offline, "MODEL": "minilm"}) == []  # aliases resolve to packaged files
    # JUDGE_MODEL is loaded only by the opt-in judge step (JUDGE=1, hf): unchecked otherwise, so a default alias whose
    # packages are not installed (a fresh machine without GENERATORS=1) never stops a run that does not judge
    missing_judge = {**offline, "JUDGE_MODEL": "org/judge"}
    assert problems_for(missing_judge) == []
    assert problems_for({**missing_judge, "JUDGE": "1"})[0].startswith("JUDGE_MODEL: 'org/judge' is not in the")
    assert problems_for({**missing_judge, "JUDGE": "1", "GENERATOR": "openai", "OPENAI_URL": "http://127.0.0.1:1/v1"}) == []


def test_an_alias_without_its_packages_is_a_problem_unless_installs_are_not_checked(tmp_path, monkeypatch):
    """A generator alias whose packages are missing (and never converted here) stops a run before any work, naming
    the pip command; ``check_installed=False`` (a study's rows checked on a machine without GENERATORS=1) accepts the
    alias but still refuses a misspelt one and every other bad value."""
    from repair import model_packages

    monkeypatch.setenv("REPAIR_CACHE", str(tmp_path / "cache"))  # no converted folder to fall back on
    real = model_packages.PACKAGED_MODELS["qwen2.5-coder-1.5b"]
    absent = model_packages.PackagedGGUF(**{**real.__dict__, "parts": (("repairtest_no_such_part", "data/x.bin"),)})
    monkeypatch.setitem(model_packages.PACKAGED_MODELS, "qwen2.5-coder-1.5b", absent)
    env = {"TRAIN_DATA": str(TINY), "GEN_MODEL": "qwen2.5-coder-1.5b"}
    assert problems_for(env) == [f"GEN_MODEL: alias 'qwen2.5-coder-1.5b' needs 1 package(s) that are not installed "
                                 f"(repairtest_no_such_part); install with: {real.pip}"]
    assert validate(resolve(env, ROOT), env, check_installed=False) == []
    # offline, a name that is no alias must be a cached hub id (online it may still be downloaded)
    typo = {**env, "GEN_MODEL": "qwen2.5-coder-15b", "PCT": "0", "HF_HUB_OFFLINE": "1",
            "HF_HUB_CACHE": str(tmp_path / "hub")}
    problems = validate(resolve(typo, ROOT), typo, check_installed=False)
    assert [p.split(" is not in")[0] for p in problems] == ["PCT must be in 1..100, got 0",
                                                            "GEN_MODEL: 'qwen2.5-coder-15b'"]


def test_every_eval_data_entry_is_checked_with_the_files_its_task_reads(tmp_path):
    """Issue 32: each EVAL_DATA entry parses (task known) and holds what its task reads for EVAL_SPLIT (BEIR:
    corpus, queries, qrels/<split>.tsv; STS: one pairs file), checked before any work, as the evaluation would."""
    base = {"TRAIN_DATA": str(TINY)}
    eval_dir = ROOT / "tests" / "fixtures" / "eval"
    good = f"scifact:ir:{TINY} biosses:sts:{eval_dir / 'biosses-tiny.jsonl'} {ROOT / 'data' / 'biosses'}"
    assert problems_for({**base, "EVAL_DATA": good}) == []
    problems = problems_for({**base, "EVAL_DATA": good, "EVAL_SPLIT": "dev"})
    assert problems == [f"EVAL_DATA entry 'scifact:ir:{TINY}': {TINY / 'qrels' / 'dev.tsv'}[.gz]: not found "
                        f"(scifact, task ir). Get it: BEIR SciFact: https://public.ukp.informatik.tu-darmstadt.de/"
                        f"thakur/BEIR/datasets/scifact.zip (unzip; pass the scifact/ folder). Expected a BEIR folder: "
                        f"corpus.jsonl[.gz] ({{_id, title, text}} per line), queries.jsonl ({{_id, text}}) and "
                        f"qrels/<split>.tsv (header, then query-id<TAB>corpus-id<TAB>score). See docs/evaluation.md."]
    no_corpus = tmp_path / "nfcorpus"
    (no_corpus / "qrels").mkdir(parents=True)
    (no_corpus / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    (no_corpus / "queries.jsonl").write_text("")
    assert problems_for({**base, "EVAL_DATA": str(no_corpus)})[0].startswith(
        f"EVAL_DATA entry '{no_corpus}': {no_corpus / 'corpus.jsonl'}[.gz]: not found (nfcorpus, task ir)")
    no_pairs = tmp_path / "biosses_folder"
    no_pairs.mkdir()
    assert problems_for({**base, "EVAL_DATA": f"sts:{no_pairs}"})[0].startswith(
        f"EVAL_DATA entry 'sts:{no_pairs}': {no_pairs}/*.jsonl: not found (biosses_folder, task sts)")
    assert problems_for({**base, "EVAL_DATA": f"scifact:irr:{TINY}"}) == [
        f"EVAL_DATA entry 'scifact:irr:{TINY}': dataset 'scifact:irr:{TINY}': unknown task 'irr' in NAME:TASK:PATH "
        f"(expected one of ir, qa, mesh, relish, sts)"]
    # a BEIR folder passed as STS is caught too: which of its JSONL files would be the pairs?
    assert problems_for({**base, "EVAL_DATA": f"sts:{TINY}"}) == [
        f"EVAL_DATA entry 'sts:{TINY}': {TINY}: several *.jsonl files (corpus.jsonl, queries.jsonl); pass the pairs "
        f"file itself"]


def test_every_integer_setting_is_bounded_above_and_seeds_fit_every_generator():
    """Issue 44: TOP_K=99999999999999999999 passed the check and 08 died in an OverflowError; a SEED or GEN_SEED past
    2**64 killed 10 and 05 with torch's "Overflow when unpacking long long" (05 after creating its output files).
    Every int setting now has an upper bound in the table: COUNT_MAX for counts (two multiplied still fit int64),
    SEED_MAX for seeds (numpy's legacy seeding and CTranslate2 take unsigned 32-bit)."""
    assert [s.name for s in SETTINGS if s.kind == "int" and s.high is None] == []
    assert {s.name: s.high for s in SETTINGS if s.name in ("SEED", "GEN_SEED", "TOP_K")} == {
        "SEED": SEED_MAX, "GEN_SEED": SEED_MAX, "TOP_K": COUNT_MAX}
    base = {"TRAIN_DATA": str(TINY)}
    assert problems_for({**base, "TOP_K": "99999999999999999999"}) == [
        "TOP_K must be in 1..2147483647, got 99999999999999999999"]
    # GEN_SEED follows SEED unless given: a bad SEED is named once
    assert problems_for({**base, "SEED": str(2**64)}) == [f"SEED must be in 0..4294967295, got {2**64}"]
    assert problems_for({**base, "SEED": "3", "GEN_SEED": str(2**32)}) == [
        f"GEN_SEED must be in 0..4294967295, got {2**32}"]
    assert problems_for({**base, "SEED": str(SEED_MAX), "TOP_K": str(COUNT_MAX)}) == []  # the bounds themselves pass
    assert problems_for({**base, "VALID_FACTOR": "576460752303423488"}) == [
        "VALID_FACTOR must be in 1..2147483647, got 576460752303423488"]
    assert problems_for({**base, "FN_MARGIN": "nan"}) == ["FN_MARGIN must be a finite number, got 'nan'"]


def _resolve(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repair.driver.settings", "resolve", "--root", str(ROOT),
                           "--no_record"], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_derived_counts_come_from_python_and_fit_the_scripts(tmp_path):
    """The driver took VALID_FACTOR x |T0| from bash's $((...)), which wraps: VALID_FACTOR=576460752303423488 with the
    tiny T0's 16 rows gave a negative target. The target now comes from the check, in Python's integers, and a product
    past what 05_06_rounds' --target_valid takes is refused there (one line, exit 2), as is a step budget past 10's
    --max_steps; run_repair.sh itself then stops before it creates OUT_DIR."""
    env = {"TRAIN_DATA": str(TINY), "OUT_DIR": str(tmp_path / "run")}
    good = _resolve({**env, "VALID_FACTOR": "3"})
    assert good.returncode == 0, good.stderr
    assert "TARGET_VALID=48" in good.stdout.splitlines()
    fits_alone = _resolve({**env, "VALID_FACTOR": "200000000"})  # within the setting's range, but x 16 is not
    assert (fits_alone.returncode, fits_alone.stderr) == (
        2, "VALID_FACTOR x |T0| (Stage II's target of valid tuples) must be at most 2147483647, got 200000000 x 16 = "
           "3200000000\n")
    steps = _resolve({**env, "ITER_STEPS": "t0", "SCHEDULE": "one", "ITERS": "2", "EPOCHS": "1073741824",
                      "GLOBAL_BATCH": "16"})
    assert (steps.returncode, steps.stderr) == (
        2, "ITER_STEPS=t0: a training's schedule, (WARM_START + ITERS) x EPOCHS x ceil(|T0| / GLOBAL_BATCH) optimizer "
           "steps, must be at most 2147483647, got 2147483648\n")
    out = tmp_path / "driver_run"
    driver = subprocess.run(["bash", str(ROOT / "run_repair.sh")], capture_output=True, text=True, cwd=ROOT, timeout=60,
                            env={**os.environ, "PYTHON": sys.executable, "TRAIN_DATA": str(TINY), "OUT_DIR": str(out),
                                 "VALID_FACTOR": "576460752303423488"})
    assert (driver.returncode, driver.stderr) == (2, "VALID_FACTOR must be in 1..2147483647, got 576460752303423488\n")
    assert not out.exists()  # nothing written that a rerun would trust
