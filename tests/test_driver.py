"""run_repair.sh end to end on a tiny random model and tiny data: every file, the report, a rerun that skips
everything, a run killed during expansion that resumes to the same outputs, and clear input errors.

The generator is an OpenAI-compatible server on 127.0.0.1 (a real HTTP server; the tiny random model cannot
write text), answering with a query about the concepts named in the prompt, so verification finds papers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repair.differentiation.causalneg.prompts import PERTURBATIONS
from tests.helpers_sources import FakeServer, openai_route

ROOT = Path(__file__).resolve().parents[1]
MATERIALS = ["TiO2", "Fe2O3", "NaCl", "ZnO", "MoS2", "GaN", "CsPbI3", "Al2O3", "SnO2", "Cu2O"]
PROPERTIES = ["band gap", "photocatalysis", "thermal stability", "ionic conductivity"]


def make_corpus(folder: Path) -> Path:
    """40 short materials abstracts; 12 train claims (T0) and 6 test claims, each citing one document."""
    (folder / "qrels").mkdir(parents=True)
    docs, queries, train, test = [], [], [], []
    for i, (m, p) in enumerate((m, p) for m in MATERIALS for p in PROPERTIES):
        docs.append({"_id": f"d{i}", "title": f"{p.capitalize()} of {m} thin films",
                     "text": f"We report the {p} of {m} films grown by ALD and measured by XRD and DFT. "
                             f"The {m} samples annealed at {300 + 10 * i} C show a clear trend in {p}."})
    for j in range(18):
        d = docs[(j * 7) % len(docs)]
        m, p = d["title"].split(" of ")[1].split()[0], d["title"].split(" of ")[0].lower()
        queries.append({"_id": f"q{j}", "text": f"How does annealing change the {p} of {m}?"})
        (train if j < 12 else test).append((f"q{j}", d["_id"]))
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for name, rows in (("train", train), ("test", test)):
        (folder / "qrels" / f"{name}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in rows))
    return folder


def reply_for(messages: list[dict], seed: int) -> str:
    """A query about the concepts the REPAIR prompt lists ("Concept k: NAME (Attributes: ...)")."""
    prompt = messages[-1]["content"]
    concepts = re.findall(r"Concept \d+: (.+?) \(Attributes", prompt) or ["materials"]
    angle = ["band gap", "photocatalysis", "thermal stability", "ionic conductivity"][seed % 4]
    return f"How does the {angle} of {' and '.join(concepts)} films change after annealing?"


def driver_env(tmp: Path, model: Path, data: Path, server_url: str, out: str) -> dict:
    env = dict(os.environ)
    env.update({
        "PYTHON": sys.executable, "MODEL": str(model), "TRAIN_DATA": str(data),
        "OUT_DIR": str(tmp / out), "ITERS": "2", "MAX_LENGTH": "64", "BATCH_SIZE": "16", "EPOCHS": "1",
        "GLOBAL_BATCH": "8", "MINI_BATCH": "8", "LR": "1e-3", "GENERATOR": "openai",
        "OPENAI_URL": server_url + "/v1", "EVAL_DATA": f"{data} {ROOT / 'data' / 'biosses'}",
        "GEN_ROUND": "8", "MAX_ROUNDS": "2", "TOP_NEG_N": "10", "TARGET_K": "8", "TOP_K": "5",
        "CONSISTENCY_K": "5", "SEED": "7", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "REPAIR_CACHE": str(tmp / "repair_cache"), "HF_HUB_OFFLINE": "1",
    })
    env.pop("OPENAI_API_KEY", None)
    return env


def md_cells(row: str) -> list[str]:
    """The cells of a Markdown table row as a renderer splits them: on every ``|`` not escaped as ``\\|``."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def md_tables(text: str) -> list[list[str]]:
    """Runs of consecutive lines that start with ``|``."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def run_driver(env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "run_repair.sh")], env=env, capture_output=True, text=True,
                          cwd=ROOT, **kw)


def outputs(run: Path) -> dict:
    """What a run produced that must not depend on interruptions."""
    out = {}
    for k in (1, 2):
        final = run / f"iter{k}" / "differentiation" / "final_train_data.bottom_30pct.jsonl"
        out[f"final{k}"] = final.read_text()
        out[f"expansion{k}"] = (run / f"iter{k}" / "expansion" / "expansion.bottom_30pct.jsonl").read_text()
        out[f"eval{k}"] = json.loads((run / f"iter{k}" / "eval" / "eval.json").read_text())["summary"]
    return out


def card_matches_eval(folder: Path, eval_json: Path, library: str = "peft"):
    """The folder's model card parses as the Hub's ModelCardData, and its model-index holds exactly the metrics of
    the eval file (dataset, metric, value), read from it, never typed in. Returns the card."""
    from huggingface_hub import ModelCard, ModelCardData

    card = ModelCard.load(folder / "README.md")
    assert isinstance(card.data, ModelCardData) and card.data.library_name == library
    assert "More Information Needed" not in card.content
    expected = {(r["dataset"], key.replace("@", "_at_")): r[key] for r in json.loads(eval_json.read_text())["results"]
                for key in r if re.fullmatch(r"(ndcg|map|recall|mrr)@\d+|spearman|pearson", key)}
    got = {(e.dataset_name, e.metric_type): e.metric_value for e in card.data.eval_results}
    assert expected and got == expected
    return card


def step_records(run: Path) -> dict[str, list[str]]:
    """Each step's ``.outputs`` record (the files it wrote, relative to the run folder)."""
    return {f.name[:-len(".outputs")]: f.read_text().splitlines() for f in (run / ".state").glob("*.outputs")}


@pytest.fixture(scope="module")
def server():
    with FakeServer(openai_route(reply_for, model="fake-generator")) as srv:
        yield srv


def test_driver_end_to_end_skip_and_resume(tiny_model_dir, tmp_path, server):
    data = make_corpus(tmp_path / "matsci")
    env = driver_env(tmp_path, tiny_model_dir, data, server.url, "run_a")
    first = run_driver(env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run = tmp_path / "run_a"
    for k in (1, 2):
        it = run / f"iter{k}"
        for rel in ("diagnosis/01.train_diagnosis_meta.cos_percentile.json",
                    "diagnosis/confused_train_queries.bottom_30pct.cos.jsonl",
                    "diagnosis/pathA_ccs_train/cintra.bottom_30pct.jsonl",
                    "diagnosis/pathB_finch_train/pathB_finch_train.components.bottom_30pct.json",
                    "diagnosis/PathAB_terms/final_terms.bottom_30pct.txt",
                    "expansion/generated.bottom_30pct.jsonl", "expansion/expansion.bottom_30pct.jsonl",
                    "differentiation/final_train_data.bottom_30pct.jsonl", "differentiation/consistency_stats.json",
                    "adapter/adapter_config.json", "adapter/adapter_model.safetensors", "adapter/train_log.jsonl",
                    "eval/eval.json"):
            assert (it / rel).exists(), f"missing {it / rel}"
        triplets = [json.loads(x) for x in (it / "differentiation/final_train_data.bottom_30pct.jsonl").open()]
        assert triplets and all(t["d_neg"] == t["hard_negatives"][0] != t["pos_document"] for t in triplets)
    # iteration 2 started from iteration 1's adapter and trained on both iterations' triplets
    args2 = json.loads((run / "iter2" / "adapter" / "training_args.json").read_text())
    assert args2["init_adapter"] == str(run / "iter1" / "adapter")
    assert len(args2["triplets"]) == 2
    report = (run / "report.md").read_text()
    assert "| 0 (before) |" in report and "| 2 |" in report and "biosses" in report
    # |T0| etc. are escaped, so every row of every table has as many cells as the header and the separator
    assert "| iteration | \\|T0\\| | \\|Q_conf\\| | \\|C_conf\\| |" in report
    tables = md_tables(report)
    assert len(tables) == 3
    for table in tables:
        header, separator, *rows = table
        assert len(md_cells(header)) == len(md_cells(separator)) >= 2, table
        assert all(len(md_cells(row)) == len(md_cells(header)) for row in rows), table
    counts = dict(zip(md_cells(tables[1][0]), md_cells(tables[1][2])))
    assert counts["\\|T0\\|"] == "12" and counts["kept"] != "–"
    assert "0 (before)" in first.stdout  # the metrics table is printed at the end
    # each adapter's model card: the metrics of its iteration's evaluation (refreshed by the report step), what
    # was trained, the driver's exact command for the step
    for k in (1, 2):
        card = card_matches_eval(run / f"iter{k}" / "adapter", run / f"iter{k}" / "eval" / "eval.json")
        assert (run / "logs" / f"iter{k}.10_train.cmd").read_text().strip() in card.text
        assert f"REPAIR iteration {k}: trained on T0 plus the triplets of iterations 1..{k}" in card.text
        assert card.data.datasets == ["matsci"] and "| 1 | 12 |" in card.text  # |T0| of iteration 1's row
    # the console shows steps, tables and short summary lines: no raw JSON, no library deprecation noise
    assert [ln for ln in first.stdout.splitlines() if ln.lstrip().startswith("{")] == []
    assert "  summary (iter1.04_merge): stage=04_merge_cconf pct=30 " in first.stdout
    assert '"stage": "04_merge_cconf"' in (run / "logs" / "iter1.04_merge.log").read_text()  # the log keeps it
    assert "FutureWarning" not in first.stdout + first.stderr
    # |T0| = 12 and VALID_FACTOR 2: 24 valid tuples wanted, but 2 rounds of 8 queries cannot verify more than 16
    stopped = re.findall(r"expansion stopped at the round limit \(2\): (\d+) / 24 valid tuples", first.stdout)
    assert len(stopped) == 2 and all(int(n) < 24 for n in stopped), first.stdout[-3000:]  # one per iteration
    assert json.loads((run / "settings.json").read_text())["settings"]["PCT"] == 30
    # every done step lists the files it wrote (what a reuse of its steps copies), each file under one step only
    # (a later round appending to a file excepted: the stage record is the union of its rounds)
    records = step_records(run)
    assert sorted(records) == sorted(m.name[:-len(".done")] for m in (run / ".state").glob("*.done"))
    assert records["iter0.eval"] == ["iter0/eval/eval.json"]
    assert records["iter1.01_margin"] == ["iter1/diagnosis/01.train_all_query_margins.cos.jsonl",
                                          "iter1/diagnosis/01.train_diagnosis_meta.cos_percentile.json",
                                          "iter1/diagnosis/confused_train_queries.bottom_30pct.cos.jsonl"]
    assert records["iter1.08_hardneg"] == ["iter1/differentiation/hard_negatives.bottom_30pct.jsonl",
                                           "iter1/differentiation/hard_negatives.bottom_30pct.stats.json"]
    assert records["iter2.09_consistency"] == ["iter2/differentiation/consistency_stats.json",
                                               "iter2/differentiation/final_train_data.bottom_30pct.jsonl"]
    assert "iter1/expansion/generated.bottom_30pct.jsonl" in records["iter1.05_generate.r1"]
    assert not any(f.startswith("iter1/expansion/expansion.") for f in records["iter1.05_generate.r1"])
    assert {"iter1/expansion/generated.bottom_30pct.jsonl", "iter1/expansion/expansion.bottom_30pct.jsonl"} <= set(
        records["iter1.expansion"])
    # the funnel is the driver's, written between rounds: the stage's file, never a round step's (it once landed in
    # the next round's record when its write and that step's start stamp shared a clock tick)
    for k in (1, 2):
        funnel = f"iter{k}/expansion/expansion.bottom_30pct.jsonl.funnel.jsonl"
        assert funnel in records[f"iter{k}.expansion"]
        assert not any(funnel in files for name, files in records.items() if name != f"iter{k}.expansion")
    assert all(f.startswith("iter1/adapter/") for f in records["iter1.10_train"])
    assert "iter1/adapter/adapter_model.safetensors" in records["iter1.10_train"]
    owners = {}
    for name, files in records.items():
        for f in files:
            assert (run / f).is_file(), (name, f)
            if ".expansion" not in name and "_verify.r2" not in name and "_generate.r2" not in name:
                assert owners.setdefault(f, name) == name, (f, owners[f], name)
    assert not list((run / ".state").glob("*.started"))

    before = outputs(run)
    report_stat = (run / "report.md").stat().st_mtime_ns
    second = run_driver(env, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    started = [ln for ln in second.stdout.splitlines() if "] start " in ln and "start report" not in ln]
    assert started == [], started
    assert outputs(run) == before
    # a rerun that did nothing does not rewrite the report (it prints it)
    assert "nothing to do: every step was already done; the report is unchanged" in second.stdout
    assert "0 (before)" in second.stdout and (run / "report.md").stat().st_mtime_ns == report_stat

    # a rerun with settings that change results is refused within seconds, naming each difference
    t0 = time.time()
    changed = run_driver({**env, "PCT": "20", "MODEL": "minilm", "TOP_K": "6", "DEVICE": "cpu"}, timeout=60)
    assert changed.returncode == 2 and time.time() - t0 < 20, changed.stdout + changed.stderr
    assert f"  MODEL: the run used '{tiny_model_dir}', now 'minilm'\n  PCT: the run used 30, now 20\n" in changed.stderr
    assert "  TOP_K: the run used 5, now 6\n" in changed.stderr and "FORCE=1" in changed.stderr
    assert "DEVICE" not in changed.stderr and "] start " not in changed.stdout
    assert (run / "report.md").stat().st_mtime_ns == report_stat
    # the report tool itself refuses a PCT the run did not use (its files would read as dashes)
    wrong = subprocess.run([sys.executable, str(ROOT / "eval" / "run_report.py"), "--run_dir", str(run), "--pct", "20"],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode != 0 and "settings.json says the run used PCT=30" in wrong.stderr
    assert (run / "report.md").stat().st_mtime_ns == report_stat

    # a training killed before its first checkpoint (--save_steps 0 writes none) leaves its args and log behind;
    # the rerun must start that training over, not refuse the folder, and end with the same model
    adapter = run / "iter2" / "adapter"
    steps_before = [json.loads(x)["step"] for x in (adapter / "train_log.jsonl").open()]
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (adapter / name).unlink()
    shutil.rmtree(adapter / "checkpoints", ignore_errors=True)
    for marker in ("iter2.10_train.done", "iter2.eval.done"):
        (run / ".state" / marker).unlink()
    (run / "iter2" / "eval" / "eval.json").unlink()
    assert (adapter / "training_args.json").exists() and steps_before
    rerun = run_driver(env, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "start iter2.10_train" in rerun.stdout and "start iter1.10_train" not in rerun.stdout
    assert [json.loads(x)["step"] for x in (adapter / "train_log.jsonl").open()] == steps_before
    assert outputs(run) == before

    # a run killed during expansion, then resumed, ends with the same outputs as the uninterrupted one
    env_b = driver_env(tmp_path, tiny_model_dir, data, server.url, "run_b")
    env_b["REPAIR_CACHE"] = env["REPAIR_CACHE"]
    server.slow_all = 0.3  # widen the expansion window so the kill lands inside it
    proc = subprocess.Popen(["bash", str(ROOT / "run_repair.sh")], env=env_b, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    generated = tmp_path / "run_b" / "iter1" / "expansion" / "generated.bottom_30pct.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if generated.exists() and generated.read_text().count("\n") >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the driver finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    server.slow_all = 0.0
    assert not (tmp_path / "run_b" / ".state" / "iter1.expansion.done").exists()
    resumed = run_driver(env_b, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "skip  iter1.01_margin (done)" in resumed.stdout
    a, b = outputs(run), outputs(tmp_path / "run_b")
    # the killed step's record lists what its first attempt wrote too: the resumed run records what the other did
    def named_alike(recs: dict) -> dict:  # TensorBoard's event files are named after the time and the process
        return {name: [f for f in files if "/runs/events.out.tfevents." not in f] for name, files in recs.items()}

    assert named_alike(step_records(tmp_path / "run_b")) == named_alike(records)
    assert a["final1"] == b["final1"] and a["expansion1"] == b["expansion1"]
    assert a["final2"] == b["final2"] and a["expansion2"] == b["expansion2"]
    for k in ("eval1", "eval2"):
        for name, metrics in a[k].items():
            for metric, value in metrics.items():
                assert b[k][name][metric] == pytest.approx(value, abs=1e-6)


def test_driver_checks_every_setting_before_any_work(tmp_path):
    """PCT=150 used to fail in step 01, after the baseline evaluation; now the driver stops in a second."""
    t0 = time.time()
    proc = run_driver(dict(os.environ, PCT="150", LR="fast", DEMO="tiny", OUT_DIR=str(tmp_path / "r")), timeout=30)
    assert proc.returncode == 2 and time.time() - t0 < 10
    assert proc.stderr.splitlines() == ["PCT must be in 1..100, got 150", "LR must be a number, got 'fast'"]
    assert proc.stdout == "" and not (tmp_path / "r").exists()


def test_driver_input_errors(tmp_path):
    env = dict(os.environ, TRAIN_DATA=str(tmp_path / "missing_t0.jsonl"), OUT_DIR=str(tmp_path / "r"))
    proc = run_driver(env, timeout=60)
    assert proc.returncode == 2 and f"TRAIN_DATA not found: {tmp_path / 'missing_t0.jsonl'}" in proc.stderr
    env = dict(os.environ, SOURCE="google", OUT_DIR=str(tmp_path / "r"))
    proc = run_driver(env, timeout=60)
    assert proc.returncode == 2 and "SOURCE must be" in proc.stderr
    env = dict(os.environ, EVAL_DATA=f"scifact:ir:{tmp_path / 'nope'}", OUT_DIR=str(tmp_path / "r"))
    proc = run_driver(env, timeout=60)
    assert proc.returncode == 2 and "EVAL_DATA entry not found" in proc.stderr
    help_text = subprocess.run(["bash", str(ROOT / "run_repair.sh"), "--help"], capture_output=True, text=True)
    env = dict(os.environ, TOP_K="3", CONSISTENCY_K="5", OUT_DIR=str(tmp_path / "r"))
    proc = run_driver(env, timeout=60)
    assert proc.returncode == 2 and "TOP_K (3) must be >= CONSISTENCY_K (5)" in proc.stderr
    env = dict(os.environ, GEN_ADAPTER=str(tmp_path / "no_adapter"), OUT_DIR=str(tmp_path / "r"))
    proc = run_driver(env, timeout=60)
    assert proc.returncode == 2 and f"no adapter_config.json in '{tmp_path / 'no_adapter'}'" in proc.stderr
    assert help_text.returncode == 0 and "CONSISTENCY_K" in help_text.stdout and "--gres=gpu:1" not in help_text.stdout
    assert "sbatch --nodes=2" in help_text.stdout  # the 2-node example (issue 42), not the #SBATCH header


def causalneg_reply(messages: list[dict], seed: int) -> str:
    """The REPAIR query prompt as above; CausalNeg's stage 1 a typed requirement list, stage 3 a short abstract
    that names the perturbation it was asked for (so the test can follow it into the triplet file)."""
    prompt = messages[-1]["content"]
    if prompt.startswith("You analyse"):
        return ("1. names the specific material studied in the query [entity_substitution]\n"
                "2. reports the measured property after annealing [constraint_violation]")
    if prompt.startswith("You write documents"):
        kind = next(k for k, v in PERTURBATIONS.items() if v in prompt)
        return (f"We grew ZnO and SnO2 films by sputtering and report their optical absorption, surface roughness "
                f"and grain size after rapid thermal processing at {400 + seed % 50} C, a case of "
                f"{kind.replace('_', ' ')}, compared with untreated reference samples from the same batch.")
    return reply_for(messages, seed)


def test_driver_causalneg_negatives_reach_training_with_qem(tiny_model_dir, tmp_path):
    data = make_corpus(tmp_path / "matsci")
    with FakeServer(openai_route(causalneg_reply, model="fake-generator")) as srv:
        env = driver_env(tmp_path, tiny_model_dir, data, srv.url, "run_cn")
        env.update({"ITERS": "1", "NEGATIVES": "causalneg", "CN_K": "2", "CN_RATIO": "0.5", "EVAL_DATA": str(data)})
        proc = run_driver(env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dif = tmp_path / "run_cn" / "iter1" / "differentiation"
    repair_rows = [json.loads(x) for x in (dif / "final_train_data.bottom_30pct.jsonl").open()]
    cn_rows = [json.loads(x) for x in (dif / "final_train_data.causalneg.bottom_30pct.jsonl").open()]
    assert len(repair_rows) >= 2 and [r["query"] for r in cn_rows] == [r["query"] for r in repair_rows]
    # CN_RATIO 0.5: 0.5 x N rounded half up of the kept tuples get generated negatives, the others pass through
    augmented = [(base, row) for base, row in zip(repair_rows, cn_rows) if "generated" in row["negative_sources"]]
    assert len(augmented) == (len(repair_rows) + 1) // 2
    for base, row in zip(repair_rows, cn_rows):
        if "generated" not in row["negative_sources"]:
            assert row["hard_negatives"] == base["hard_negatives"]
            assert set(row["negative_sources"]) == {"mined"}
    for base, row in augmented:
        n_mined = len(base["hard_negatives"])
        # REPAIR's own negatives stay first and mined; CN_K generated ones follow with their traces
        assert row["hard_negatives"][:n_mined] == base["hard_negatives"]
        assert row["negative_sources"] == ["mined"] * n_mined + ["generated"] * 2
        assert [t["perturbation"] for t in row["negative_traces"][n_mined:]] == ["entity_substitution",
                                                                                "constraint_violation"]
        for trace, text in zip(row["negative_traces"][n_mined:], row["hard_negatives"][n_mined:]):
            assert f"a case of {trace['perturbation'].replace('_', ' ')}," in text
    args = json.loads((tmp_path / "run_cn" / "iter1" / "adapter" / "training_args.json").read_text())
    assert args["triplets"] == [str(dif / "final_train_data.causalneg.bottom_30pct.jsonl")]
    assert args["qem_lambda"] == 0.1 and args["num_hard_negatives"] == -1
    log = [json.loads(x) for x in (tmp_path / "run_cn" / "iter1" / "adapter" / "train_log.jsonl").open()]
    assert sum(row["qem_queries"] for row in log) > 0  # the entropy term saw generated negatives


def generator_command(env: dict) -> str:
    """Start the driver, wait for it to write iteration 1's first generation command, stop it, return the command.

    The step's .cmd file is written before the step runs, so this reads exactly what 05 was launched with without
    depending on what the tiny random model generates; the killed round is not marked done and reruns next time.
    """
    cmd_file = Path(env["OUT_DIR"]) / "logs" / "iter1.05_generate.r1.cmd"
    cmd_file.unlink(missing_ok=True)
    proc = subprocess.Popen(["bash", str(ROOT / "run_repair.sh")], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not cmd_file.exists():
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    output = proc.communicate()[0]
    assert cmd_file.exists(), output[-3000:]
    return cmd_file.read_text()


def test_driver_gen_adapter_chooses_the_generators_lora(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    adapters = {}
    for name in ("retriever", "other"):  # two real LoRA adapters on the tiny model
        lora = get_peft_model(AutoModel.from_pretrained(tiny_model_dir),
                              LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
        lora.save_pretrained(tmp_path / name)
        adapters[name] = str(tmp_path / name)
    data = make_corpus(tmp_path / "matsci")
    env = driver_env(tmp_path, tiny_model_dir, data, "http://127.0.0.1:9", "run_gen")
    env.update({"GENERATOR": "hf", "ITERS": "1", "EVAL_DATA": "", "ADAPTER": adapters["retriever"]})
    # auto (the paper): the generator is the retriever's backbone with the retriever's current adapter
    command = generator_command(env)
    assert f"--adapter {adapters['retriever']}" in command
    assert "--gen_backend hf " in command  # GEN_BACKEND's default: transformers
    # that folder's finished diagnosis was made with GEN_ADAPTER=auto: another generator there is refused
    refused = run_driver({**env, "GEN_ADAPTER": "none"}, timeout=60)
    assert refused.returncode == 2 and "  GEN_ADAPTER: the run used 'auto', now 'none'" in refused.stderr
    assert "--adapter" not in generator_command({**env, "GEN_ADAPTER": "none", "OUT_DIR": str(tmp_path / "r_none")})
    chosen = generator_command({**env, "GEN_ADAPTER": adapters["other"], "OUT_DIR": str(tmp_path / "r_other")})
    assert f"--adapter {adapters['other']}" in chosen and adapters["retriever"] not in chosen
    # a different generator model never gets the retriever's adapter under auto
    other_model = {**env, "GEN_MODEL": str(tiny_model_dir) + "/", "OUT_DIR": str(tmp_path / "r_model")}
    assert "--adapter" not in generator_command(other_model)


def test_driver_gen_backend_picks_the_generators_engine(tiny_model_dir, tmp_path):
    """One setting (issue 33): GEN_BACKEND=ct2 reaches 05 as --gen_backend ct2; the default stays transformers."""
    data = make_corpus(tmp_path / "matsci")
    env = driver_env(tmp_path, tiny_model_dir, data, "http://127.0.0.1:9", "run_ct2")
    env.update({"GENERATOR": "hf", "ITERS": "1", "EVAL_DATA": "", "GEN_BACKEND": "ct2"})
    assert "--gen_backend ct2 " in generator_command(env)  # (the default hf: test_driver_gen_adapter_...)
    bad = run_driver({**env, "GEN_BACKEND": "vllm", "OUT_DIR": str(tmp_path / "r_bad")}, timeout=60)
    assert bad.returncode == 2 and "GEN_BACKEND" in bad.stderr and "vllm" in bad.stderr


@pytest.mark.parametrize("script", ["expansion/05_query_generation.py", "expansion/06c_t0_style_queries.py",
                                    "differentiation/09b_counterfactual_negatives.py"])
def test_every_generating_script_takes_the_engine_flag(script):
    out = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and "--gen_backend {hf,ct2}" in out.stdout


def test_report_tables_render_and_a_rewrite_never_loses_numbers(tmp_path):
    """A report rebuilt when its inputs are gone (or read under another PCT) used to replace the counts with
    dashes; and the |T0| headers broke the Markdown tables."""
    from repair.evaluation.report import ReportError, write_report

    run = tmp_path / "run"
    (run / "iter0" / "eval").mkdir(parents=True)
    (run / "iter1" / "diagnosis").mkdir(parents=True)
    result = {"dataset": "scifact", "headline": "ndcg@10", "ndcg@10": 0.5}
    (run / "iter0" / "eval" / "eval.json").write_text(json.dumps({"results": [result]}))
    meta = run / "iter1" / "diagnosis" / "01.train_diagnosis_meta.cos_percentile.json"
    meta.write_text(json.dumps({"t0": {"rows": 12}, "percentiles": {"30": {"confused": 4}}}))
    path, _ = write_report(run, 30)
    text = path.read_text()
    for table in md_tables(text):
        header, separator, *rows = table
        assert len(md_cells(header)) == len(md_cells(separator)), table
        assert all(len(md_cells(row)) == len(md_cells(header)) for row in rows), table
    counts = next(t for t in md_tables(text) if "Q_conf" in t[0])
    assert dict(zip(md_cells(counts[0]), md_cells(counts[2])))["\\|Q_conf\\|"] == "4"

    meta.unlink()  # the diagnosis is gone: a rebuild would show "–" where the report said 4
    with pytest.raises(ReportError, match="no longer give iter1 t0, iter1 q_conf"):
        write_report(run, 30)
    assert path.read_text() == text
    write_report(run, 30, overwrite=True)  # the driver passes --force only with FORCE=1
    assert "| 1 | – | – |" in path.read_text()


def test_driver_issue16_levers_reach_their_steps(tiny_model_dir, tmp_path, server):
    """QUERY_FORM=generated, CONFUSED_TUPLES=1, FN_PCT and EXPANSION=0 (issue 16's opt-in levers) each change the
    command of the step they belong to, and their outputs reach training."""
    data = make_corpus(tmp_path / "matsci")
    env = driver_env(tmp_path, tiny_model_dir, data, server.url, "run_levers")
    env.update({"ITERS": "1", "EVAL_DATA": "", "QUERY_FORM": "generated", "CONFUSED_TUPLES": "1", "FN_PCT": "0.99"})
    proc = run_driver(env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run, logs = tmp_path / "run_levers", tmp_path / "run_levers" / "logs"
    dif, exp = run / "iter1" / "differentiation", run / "iter1" / "expansion"
    assert "--query_form generated" in (logs / "iter1.06_verify.r1.cmd").read_text()
    verified = [json.loads(x) for x in (exp / "expansion.bottom_30pct.jsonl").open()]
    assert verified and all(r["q_new"] == r["q_model"] for r in verified)
    confused = [json.loads(x) for x in (dif / "confused_tuples.bottom_30pct.jsonl").open()]
    t0_queries = {json.loads(x)["text"] for x in (data / "queries.jsonl").open()}
    assert confused and {r["q_new"] for r in confused} <= t0_queries
    embed_cmd = (logs / "iter1.07_embed.cmd").read_text()
    assert str(exp / "expansion.bottom_30pct.jsonl") in embed_cmd and str(dif / "confused_tuples.bottom_30pct.jsonl") in embed_cmd
    assert "--fn_pct 0.99" in (logs / "iter1.08_hardneg.cmd").read_text()
    final = [json.loads(x) for x in (dif / "final_train_data.bottom_30pct.jsonl").open()]
    assert {r["query"] for r in final} & {r["q_new"] for r in confused}  # confused claims are trained on
    # EXPANSION=0 alone is refused before any work; with CONFUSED_TUPLES=1 Stage II is skipped
    refused = run_driver({**env, "CONFUSED_TUPLES": "0", "EXPANSION": "0", "OUT_DIR": str(tmp_path / "r0")}, timeout=60)
    assert refused.returncode == 2 and "EXPANSION=0 needs CONFUSED_TUPLES=1" in refused.stderr
    # issue 16's best measured configuration (PROFILE=confused-bm25's levers): no Stage II, and T0's own claims
    # train with BM25-mined negatives (T0_NEGATIVES=bm25) instead of the plain T0 pairs
    only = {**env, "EXPANSION": "0", "T0_NEGATIVES": "bm25", "OUT_DIR": str(tmp_path / "run_conf_only")}
    proc = run_driver(only, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    only_dir = tmp_path / "run_conf_only" / "iter1"
    assert not (only_dir / "expansion" / "expansion.bottom_30pct.jsonl").exists()
    assert "expansion.bottom" not in (tmp_path / "run_conf_only" / "logs" / "iter1.07_embed.cmd").read_text()
    rows = [json.loads(x) for x in (only_dir / "differentiation" / "final_train_data.bottom_30pct.jsonl").open()]
    assert rows and {r["query"] for r in rows} <= t0_queries
    t0_bm25 = tmp_path / "run_conf_only" / "t0_negatives" / "t0_bm25.jsonl"
    mined = [json.loads(x) for x in t0_bm25.open()]
    titles = {json.loads(x)["_id"]: json.loads(x)["title"] for x in (data / "corpus.jsonl").open()}
    train_pairs = [x.split("\t") for x in (data / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    assert len(mined) == len(train_pairs) == 12 and {r["query"] for r in mined} <= t0_queries
    for r in mined:  # BM25's negatives are other corpus documents, never the claim's own positive
        assert r["hard_negatives"] and r["pos_document"] not in r["hard_negatives"]
        assert all(any(n.startswith(t) or t in n for t in titles.values()) for n in r["hard_negatives"])
    train_cmd = (tmp_path / "run_conf_only" / "logs" / "iter1.10_train.cmd").read_text()
    assert f"--triplets {t0_bm25}" in train_cmd and "--train_data" not in train_cmd
    args = json.loads((only_dir / "adapter" / "training_args.json").read_text())
    assert args["examples"] == len(mined) + len(rows)


def test_driver_warm_start_diagnoses_the_fine_tuned_model_at_t0s_steps(tiny_model_dir, tmp_path, server):
    """WARM_START=1 (issue 16's lever 4 as one run): plain fine-tuning on T0 alone comes first, and iteration 0's
    evaluation, iteration 1's diagnosis, Stage III's embeddings and iteration 1's training all start from that model,
    not the backbone. ITER_STEPS=t0 gives every training the steps plain fine-tuning on T0 takes."""
    data = make_corpus(tmp_path / "matsci")
    env = driver_env(tmp_path, tiny_model_dir, data, server.url, "run_warm")
    env.update({"ITERS": "1", "EPOCHS": "2", "EXPANSION": "0", "CONFUSED_TUPLES": "1", "T0_NEGATIVES": "bm25",
                "WARM_START": "1", "ITER_STEPS": "t0"})
    proc = run_driver(env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run, logs = tmp_path / "run_warm", tmp_path / "run_warm" / "logs"
    warm = run / "iter0" / "adapter"
    t0_bm25 = run / "t0_negatives" / "t0_bm25.jsonl"
    # |T0| = 12 pairs at GLOBAL_BATCH 8: 2 steps an epoch, EPOCHS 2 -> 4 steps for every training
    warm_cmd = (logs / "iter0.10_warm_start.cmd").read_text()
    assert f"--triplets {t0_bm25}" in warm_cmd and "--max_steps 4" in warm_cmd and "--init_adapter" not in warm_cmd
    assert [json.loads(x)["step"] for x in (warm / "train_log.jsonl").open()] == [1, 2, 3, 4]
    # LoRA (the test's FULL_FINETUNE=0): the warm-started adapter is what every later step loads
    for step in ("iter0.eval", "iter1.01_margin", "iter1.07_embed"):
        assert f"--adapter {warm}" in (logs / f"{step}.cmd").read_text(), step
    train_cmd = (logs / "iter1.10_train.cmd").read_text()
    assert f"--init_adapter {warm}" in train_cmd and "--max_steps 4" in train_cmd
    trained = json.loads((run / "iter1" / "adapter" / "training_args.json").read_text())
    # the kept tuples take batch slots: more examples than T0's, the same 4 steps
    assert trained["examples"] > 12
    assert [json.loads(x)["step"] for x in (run / "iter1" / "adapter" / "train_log.jsonl").open()] == [1, 2, 3, 4]
    # the warm start trained the retriever: LoRA's B matrices start at zero, so nonzero ones are trained weights
    from safetensors.torch import load_file
    lora_b = [t for name, t in load_file(warm / "adapter_model.safetensors").items() if "lora_B" in name]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)
    report = json.loads((run / "report.json").read_text())
    assert report["iterations"][0]["seconds"]["training"] > 0  # the warm start counts as iteration 0's training
    # the off-the-shelf model (MODEL, no adapter) is evaluated before the warm start and is the report's own row
    offshelf_cmd = (logs / "iter0.eval_offshelf.cmd").read_text()
    assert f"--model {tiny_model_dir} " in offshelf_cmd and "--adapter" not in offshelf_cmd
    offshelf = json.loads((run / "iter0" / "eval_offshelf" / "eval.json").read_text())["results"][0]
    assert report["iterations"][0]["offshelf_eval"][f"{offshelf['dataset']} {offshelf['headline']}"] == offshelf[
        offshelf["headline"]]
    table = (run / "report.md").read_text()
    assert f"| off the shelf (before the warm start) | {offshelf[offshelf['headline']]:.4f}" in table
    assert "| 0 (warm start on T0) |" in table and "0 (before)" not in table
    # the warm start's adapter has its card, with iteration 0's metrics (the warm-started model's)
    card = card_matches_eval(warm, run / "iter0" / "eval" / "eval.json")
    assert "the warm start (WARM_START=1)" in card.text and "off-the-shelf base" in card.text
    # ITER_STEPS=t0 and a --max_steps of one's own are refused before any work, naming both
    refused = run_driver({**env, "TRAIN_EXTRA": "--max_steps 9", "OUT_DIR": str(tmp_path / "r1")}, timeout=60)
    assert refused.returncode == 2 and "ITER_STEPS=t0 sets each training's --max_steps" in refused.stderr


def test_driver_one_schedule_continues_the_warm_start_mid_schedule(tiny_model_dir, tmp_path, server):
    """SCHEDULE=one: the warm start is the first T0_STEPS slice of one schedule of (WARM_START + ITERS) x T0_STEPS
    steps, and iteration 1 goes on from its weights, optimizer, LR and step with REPAIR's data added (no second
    warmup), so a plain run of the whole schedule is the exact control; CONTROL=1 trains that control (the same
    slice on T0's data alone) and the report sets REPAIR beside it. Both refused without ITER_STEPS=t0."""
    data = make_corpus(tmp_path / "matsci")
    env = driver_env(tmp_path, tiny_model_dir, data, server.url, "run_one")
    env.update({"ITERS": "1", "EPOCHS": "2", "EXPANSION": "0", "CONFUSED_TUPLES": "1", "T0_NEGATIVES": "bm25",
                "WARM_START": "1", "ITER_STEPS": "t0", "SCHEDULE": "one", "WARMUP_RATIO": "0.25", "CONTROL": "1"})
    proc = run_driver(env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run, logs = tmp_path / "run_one", tmp_path / "run_one" / "logs"
    warm = run / "iter0" / "adapter"
    # |T0| = 12 pairs at GLOBAL_BATCH 8: T0_STEPS = 4; one schedule of 8 steps, the warm start ends at step 4
    warm_cmd = (logs / "iter0.10_warm_start.cmd").read_text()
    assert "--max_steps 8 --last_step 4" in warm_cmd and "--continue_from" not in warm_cmd
    train_cmd = (logs / "iter1.10_train.cmd").read_text()
    assert f"--max_steps 8 --last_step 8 --continue_from {warm}" in train_cmd
    warm_log = [json.loads(x) for x in (warm / "train_log.jsonl").open()]
    iter_log = [json.loads(x) for x in (run / "iter1" / "adapter" / "train_log.jsonl").open()]
    assert [r["step"] for r in warm_log] == [1, 2, 3, 4] and [r["step"] for r in iter_log] == [5, 6, 7, 8]
    # warmup of ceil(0.25 x 8) = 2 steps, then one linear decay to 0 at step 8 across both trainings (the lr a step
    # trained with): no second warmup at step 5
    lr = warm_log[2]["lr"]
    assert [r["lr"] for r in warm_log + iter_log] == pytest.approx([lr * f for f in (0, 1 / 2, 1, 5 / 6, 4 / 6, 3 / 6,
                                                                                     2 / 6, 1 / 6)])
    trained = json.loads((run / "iter1" / "adapter" / "training_args.json").read_text())
    assert trained["continued_from_step"] == 4 and trained["examples"] > 12 and trained["total_steps"] == 8
    # the control: the same command on T0's BM25 triplets alone (no tuples), from the same warm start
    control_cmd = (logs / "iter1.10_control.cmd").read_text()
    t0_bm25 = run / "t0_negatives" / "t0_bm25.jsonl"
    assert control_cmd.replace(str(run / "iter1" / "control"), "OUT") == train_cmd.replace(
        f" --triplets {run / 'iter1' / 'differentiation' / 'final_train_data.bottom_30pct.jsonl'}", "").replace(
        str(run / "iter1" / "adapter"), "OUT")
    assert f"--triplets {t0_bm25}" in control_cmd
    control_args = json.loads((run / "iter1" / "control" / "training_args.json").read_text())
    assert control_args["continued_from_step"] == 4 and control_args["examples"] == 12
    assert f"--adapter {run / 'iter1' / 'control'}" in (logs / "iter1.eval_control.cmd").read_text()
    report = json.loads((run / "report.json").read_text())
    repair_ndcg = report["iterations"][1]["eval"]
    control_ndcg = report["iterations"][1]["control_eval"]
    assert repair_ndcg.keys() == control_ndcg.keys() and repair_ndcg
    name = next(iter(repair_ndcg))
    table = (run / "report.md").read_text()
    assert f"| 1: plain control, same steps | {control_ndcg[name]:.4f}" in table
    assert f"| 1: REPAIR - control | {repair_ndcg[name] - control_ndcg[name]:+.4f}" in table
    card = card_matches_eval(run / "iter1" / "control", run / "iter1" / "eval_control" / "eval.json")
    assert "the plain control of iteration 1 (CONTROL=1)" in card.text
    for setting in ("SCHEDULE=one splits one schedule", "CONTROL=1 trains the control"):
        refused = run_driver({**env, "ITER_STEPS": "epochs", "OUT_DIR": str(tmp_path / "r1")}, timeout=60)
        assert refused.returncode == 2 and setting in refused.stderr


def doc2query_reply(messages: list[dict], seed: int) -> str:
    """A query from the words of the passage 06c shows last (the document the query is written from)."""
    passage = messages[-1]["content"].rsplit("Passage: ", 1)[1]
    words = re.findall(r"[A-Za-z0-9]{3,}", passage)
    return f"Query: {words[3]} {words[4]} of {words[5]} films after annealing"


def test_driver_doc2query_writes_queries_from_the_confusing_documents(tiny_model_dir, tmp_path):
    """QUERY_FORM=doc2query (issue 30): no 05 / 06 rounds; 06b's confused tuples feed 06c --doc2query, whose
    tuples (d+ = a document that outranked a confused claim's positive) are Stage III's input and reach training;
    with CONFUSED_TUPLES=0 the confused claims themselves are not. With HARD_TUPLES=1 (issue 43) step 06e selects
    among 06c's tuples (HARD_MARGIN 2, the largest cosine margin: every tuple with a candidate is hard) and 07 reads its file."""
    data = make_corpus(tmp_path / "matsci")
    with FakeServer(openai_route(doc2query_reply, model="fake-generator")) as llm:
        env = driver_env(tmp_path, tiny_model_dir, data, llm.url, "run_d2q")
        env.update({"ITERS": "1", "EVAL_DATA": "", "QUERY_FORM": "doc2query", "QUERY_STYLE": "mixed",
                    "D2Q_DOCS": "2", "GEN_SEED": "3", "HARD_TUPLES": "1", "HARD_MARGIN": "2", "HARD_DUP": "1",
                    "HARD_LEX_TIE": "-1"})
        proc = run_driver(env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run, logs = tmp_path / "run_d2q", tmp_path / "run_d2q" / "logs"
    assert not list(logs.glob("iter1.05_*")) and not list(logs.glob("iter1.06_verify*"))
    cmd = (logs / "iter1.06c_doc2query.cmd").read_text()
    confused_path = run / "iter1" / "differentiation" / "confused_tuples.bottom_30pct.jsonl"
    assert f"--input_jsonl {confused_path}" in cmd and "--doc2query 2 " in cmd and "--style mixed" in cmd
    # GEN_SEED seeds the writing, SEED (7) the training
    assert "--seed 3 " in cmd and "--seed 7 " in (logs / "iter1.10_train.cmd").read_text()
    confused = [json.loads(x) for x in confused_path.open()]
    written = run / "iter1" / "expansion" / "expansion.doc2query.bottom_30pct.jsonl"
    tuples = [json.loads(x) for x in written.open()]
    first_docs = {c["abstract"] for r in confused for c in r["negative_candidates"][:2]}
    assert tuples and {t["d_pos"] for t in tuples} <= first_docs
    for t in tuples:  # the positives of the confused claims the document outranked come first among its candidates
        seeds = [r for r in confused if r["id"] in t["seed_queries"]]
        assert [c["abstract"] for c in t["negative_candidates"][:len(seeds)]] == [r["d_pos"] for r in seeds]
        assert t["query_form"] == "doc2query" and t["q_new"].endswith("films after annealing")
    hard_path = run / "iter1" / "expansion" / "expansion.hard.bottom_30pct.jsonl"
    assert f"--input_jsonl {written} --output_jsonl {hard_path} " in (logs / "iter1.06e_hard.cmd").read_text()
    hard = [json.loads(x) for x in hard_path.open()]
    assert {t["id"] for t in hard} == {t["id"] for t in tuples if t["negative_candidates"]} and hard
    embed_cmd = (logs / "iter1.07_embed.cmd").read_text()
    assert str(hard_path) in embed_cmd and str(confused_path) not in embed_cmd  # CONFUSED_TUPLES=0
    final = [json.loads(x) for x in (run / "iter1" / "differentiation" / "final_train_data.bottom_30pct.jsonl").open()]
    assert final and {r["query"] for r in final} <= {t["q_new"] for t in hard}
    report = json.loads((run / "report.json").read_text())["iterations"][1]
    assert report["generated"] == len([json.loads(x) for x in open(f"{written}.sources.jsonl")])
    assert report["generated_accepted"] == len(tuples)
    assert report["hard"] == len(hard) and "| hard | kept |" in (run / "report.md").read_text()


def test_driver_force_retrains_every_training_with_the_new_settings(tiny_model_dir, tmp_path):
    """Issue 44: after a finished run, FORCE=1 LR=5e-3 "re-ran" every step but the trainings said "training already
    finished" (the driver passed --resume, the trainer returned before comparing settings): the old adapters stayed,
    under a settings.json with the new LR and model cards that gave both. Now FORCE=1 starts the run folder over:
    the warm start, each iteration's training and its control are retrained (other weights), T0's BM25 negatives
    are mined again, and every card, training_args.json and settings.json say the new LR."""
    data = make_corpus(tmp_path / "matsci")
    env = driver_env(tmp_path, tiny_model_dir, data, "http://127.0.0.1:9", "run_force")
    env.update({"ITERS": "1", "EVAL_DATA": "", "EXPANSION": "0", "CONFUSED_TUPLES": "1", "T0_NEGATIVES": "bm25",
                "WARM_START": "1", "ITER_STEPS": "t0", "CONTROL": "1"})
    run = tmp_path / "run_force"
    folders = [run / "iter0" / "adapter", run / "iter1" / "adapter", run / "iter1" / "control"]

    def sha(folder: Path) -> str:
        import hashlib
        return hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest()

    first = run_driver(env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = {f: sha(f) for f in folders}
    forced = run_driver({**env, "FORCE": "1", "LR": "5e-3"}, timeout=900)
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    out = forced.stdout + forced.stderr
    assert "already finished" not in out and " (done)" not in out
    for step in ("t0.bm25_negatives", "iter0.10_warm_start", "iter1.10_train", "iter1.10_control"):
        assert f"start {step} " in forced.stdout and "--resume" not in (run / "logs" / f"{step}.cmd").read_text()
    assert json.loads((run / "settings.json").read_text())["settings"]["LR"] == 0.005
    for folder in folders:
        assert sha(folder) != before[folder], folder
        assert json.loads((folder / "training_args.json").read_text())["lr"] == 0.005
        card = (folder / "README.md").read_text()
        assert "| batch / lr / temperature | 8 / 0.005 / " in card and "| LR | `0.005` |" in card, card
        assert "0.001" not in card and "--lr 5e-3 " in card  # the old LR nowhere; the command that trained it
