"""The trainer end to end on the tiny model: the loss falls, the adapter loads with the README's peft snippet,
checkpoints resume to the weights of an uninterrupted run (also after SIGKILL), full fine-tuning, encoders,
--init_adapter, the output-folder guard and the train log."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers_train import mean_loss, synthetic_pairs, write_jsonl
from repair.data import DataError, read_json, read_jsonl
from repair.encoding import Retriever
from repair.training.trainer import list_checkpoints, train, training_finished, uses_activation_checkpointing
from repair.training.config import CAUSALNEG_QEM_LAMBDA, TrainConfig
from repair.training.data import load_training_data

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "training" / "10_train_lora.py"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cli():
    spec = importlib.util.spec_from_file_location("train_cli", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CLI = _cli()


def cli_config(argv: list[str]) -> TrainConfig:
    return CLI.config_from_args(CLI.parse_args(argv))


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train_data")
    t0 = write_jsonl(folder / "t0.jsonl", synthetic_pairs(10, seed=1))
    rows = []
    for i, r in enumerate(synthetic_pairs(6, seed=2)):
        negs = [p["positive"] for p in synthetic_pairs(3, seed=100 + i)]
        rows.append({"query": r["query"], "pos_document": r["positive"], "hard_negatives": negs,
                     "hard_negative_scores": [0.9, 0.8, 0.7], "d_neg": negs[0], "pos_rank": 1, "id": str(i),
                     "concepts": [], "negative_sources": ["mined", "mined", "generated"]})
    trip = write_jsonl(folder / "final_train_data.bottom_30pct.jsonl", rows)
    return t0, trip


def base_argv(model_dir, data_files, out, *extra) -> list[str]:
    t0, trip = data_files
    return ["--model", str(model_dir), "--train_data", t0, "--triplets", trip, "--num_hard_negatives", "-1",
            "--output_dir", str(out), "--global_batch_size", "4", "--mini_batch_size", "4", "--max_length", "64",
            "--lr", "2e-3", "--temperature", "0.05", "--lora_r", "4", "--lora_alpha", "8", "--seed", "5",
            "--qem_lambda", str(CAUSALNEG_QEM_LAMBDA), "--no_progress", *extra]  # the triplets have generated negatives


def adapter_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def readme_encode(base: str, adapter: str, texts: list[str], max_length: int = 512) -> torch.Tensor:
    """The REPAIR README's loading + encode recipe, verbatim except CPU/fp32."""
    from peft import PeftModel
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(adapter)
    model = PeftModel.from_pretrained(AutoModel.from_pretrained(base), adapter).eval()
    if tok.pad_token is None:
        tok.pad_token, tok.padding_side = tok.eos_token, "left"

    def last_token_pool(h, mask):
        if mask[:, -1].sum() == mask.shape[0]:
            return h[:, -1]
        return h[torch.arange(h.shape[0], device=h.device), mask.sum(1) - 1]

    with torch.no_grad():
        b = tok(texts, max_length=max_length - 1, truncation=True, padding=False,
                return_attention_mask=False, return_token_type_ids=False)
        b["input_ids"] = [ids + [tok.eos_token_id] for ids in b["input_ids"]]
        b = tok.pad(b, padding=True, return_attention_mask=True, return_tensors="pt")
        return F.normalize(last_token_pool(model(**b, use_cache=False).last_hidden_state, b["attention_mask"]), dim=-1)


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, data_files, tmp_path_factory):
    """An uninterrupted run (2 epochs of 16 examples, batch 4: 8 steps) that the resume tests must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    result = train(cli_config(base_argv(tiny_model_dir, data_files, out, "--save_steps", "4")))
    return out, result


def test_training_lowers_loss_and_adapter_loads_with_readme_snippet(tiny_model_dir, data_files, reference_run):
    out, result = reference_run
    assert result["status"] == "finished" and result["step"] == 8
    cfg = cli_config(base_argv(tiny_model_dir, data_files, out))
    data = load_training_data(cfg.train_data, cfg.triplets, num_hard_negatives=-1)
    before = mean_loss(Retriever.load(str(tiny_model_dir), max_length=64), data, cfg, batch_size=8)
    trained = Retriever.load(str(tiny_model_dir), adapter=str(out), max_length=64)
    after = mean_loss(trained, data, cfg, batch_size=8)
    assert after < before - 0.3, (before, after)

    config = read_json(out / "adapter_config.json")
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["lora_dropout"] == 0.05
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                             "down_proj"}
    lora_b = [t for n, t in adapter_tensors(out).items() if "lora_B" in n]
    assert lora_b and all(torch.count_nonzero(t) > 0 for t in lora_b)  # B starts at 0: it was trained

    texts = ["Given a query, retrieve passages that are relevant to the query.\nQuery: iron zinc gold",
             "Represent this passage.\nPassage: carbon nitrogen oxygen silicon iron"]
    ours = torch.cat([trained.encode_queries(["iron zinc gold"]), trained.encode_passages(
        ["carbon nitrogen oxygen silicon iron"])])
    torch.testing.assert_close(readme_encode(config["base_model_name_or_path"], str(out), texts), ours,
                               atol=1e-5, rtol=1e-4)

    args = read_json(out / "training_args.json")
    assert args["model"] == str(tiny_model_dir) and args["pooling"] == "eos" and args["total_steps"] == 8
    assert args["result"]["status"] == "finished" and args["examples"] == 16
    log = read_jsonl(out / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 9))
    assert {"loss", "lr", "grad_norm", "pos_sim", "neg_sim", "weight_mined", "weight_generated",
            "weight_in_batch", "qem_entropy"} <= set(log[0])
    assert any(r["n_generated"] > 0 and r["weight_generated"] is not None and r["qem_queries"] > 0 for r in log)
    assert log[0]["lr"] < log[2]["lr"] and log[-1]["lr"] < log[2]["lr"]  # warmup, then decay
    assert any((out / "runs").rglob("events.out.tfevents.*"))
    assert [p.name for p in list_checkpoints(out)] == ["step-0000004", "step-0000008"]  # save_total_limit 2


def test_resume_after_stop_matches_uninterrupted_run(tiny_model_dir, data_files, reference_run, tmp_path):
    ref_out, _ = reference_run
    argv = base_argv(tiny_model_dir, data_files, tmp_path / "run", "--save_steps", "4")
    first = train(cli_config(argv + ["--stop_after_steps", "3"]))
    assert first["status"] == "stopped" and first["step"] == 3
    assert not (tmp_path / "run" / "adapter_config.json").exists() and not training_finished(tmp_path / "run")
    with pytest.raises(FileExistsError, match="--resume"):
        train(cli_config(argv))
    second = train(cli_config(argv + ["--resume"]))
    assert second["status"] == "finished" and second["step"] == 8
    ref, got = adapter_tensors(ref_out), adapter_tensors(tmp_path / "run")
    assert ref.keys() == got.keys()
    for name in ref:  # same seed, same data order, restored optimizer/scheduler/RNG: the same weights
        torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=0)
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "train_log.jsonl")] == list(range(1, 9))
    assert training_finished(tmp_path / "run")  # what the quality study asks before it skips a row
    again = train(cli_config(argv + ["--resume"]))
    assert again["status"] == "already_finished"


def test_a_schedule_split_over_two_runs_ends_with_the_uninterrupted_runs_weights(tiny_model_dir, data_files,
                                                                                  reference_run, tmp_path):
    """--last_step + --continue_from (issue 16, lever 4 in one schedule): the first run stops at step 3 of the 8-step
    schedule as a finished, loadable run; a second run continues its weights, AdamW moments, LR schedule and RNG.
    On the same data the two end with the weights of one uninterrupted run, so a continued run with other data has
    the plain run as its exact control. Other data continues from the same state; another schedule is refused."""
    ref_out, _ = reference_run
    first = tmp_path / "first"
    argv_first = base_argv(tiny_model_dir, data_files, first, "--max_steps", "8", "--last_step", "3")
    assert train(cli_config(argv_first))["step"] == 3
    assert training_finished(first) and read_json(first / "training_args.json")["end_step"] == 3
    Retriever.load(str(tiny_model_dir), adapter=str(first), max_length=64)  # the model at step 3, for diagnosis
    second = tmp_path / "second"
    result = train(cli_config(base_argv(tiny_model_dir, data_files, second, "--max_steps", "8",
                                        "--continue_from", str(first))))
    assert result["status"] == "finished" and result["step"] == 8
    ref, got = adapter_tensors(ref_out), adapter_tensors(second)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=0)
    log = read_jsonl(second / "train_log.jsonl")
    assert [r["step"] for r in log] == [4, 5, 6, 7, 8]
    ref_log = read_jsonl(ref_out / "train_log.jsonl")[3:]
    assert [r["lr"] for r in log] == [r["lr"] for r in ref_log]  # the schedule goes on, no second warmup
    assert [r["loss"] for r in log] == pytest.approx([r["loss"] for r in ref_log], abs=1e-5)
    assert read_json(second / "training_args.json")["continued_from_step"] == 3

    t0, _ = data_files  # other data (T0 alone): the same start, another end
    other = tmp_path / "other"
    train(cli_config(["--model", str(tiny_model_dir), "--train_data", t0, "--output_dir", str(other),
                      "--global_batch_size", "4", "--mini_batch_size", "4", "--max_length", "64", "--lr", "2e-3",
                      "--temperature", "0.05", "--lora_r", "4", "--lora_alpha", "8", "--seed", "5",
                      "--qem_lambda", str(CAUSALNEG_QEM_LAMBDA), "--no_progress", "--max_steps", "8",
                      "--continue_from", str(first)]))
    other_log = read_jsonl(other / "train_log.jsonl")
    assert other_log[0]["step"] == 4 and other_log[0]["lr"] == pytest.approx(log[0]["lr"])  # the schedule goes on
    assert any(not torch.allclose(t, ref[n]) for n, t in adapter_tensors(other).items())

    with pytest.raises(ValueError, match=r"the schedules differ \(lr: .* has 0.002, this run 0.001"):
        train(cli_config(base_argv(tiny_model_dir, data_files, tmp_path / "x", "--max_steps", "8", "--lr", "1e-3",
                                   "--continue_from", str(first))))
    with pytest.raises(ValueError, match="total_steps"):  # an epoch-sized schedule of other data is another schedule
        train(cli_config(base_argv(tiny_model_dir, data_files, tmp_path / "y", "--epochs", "3",
                                   "--continue_from", str(first))))
    with pytest.raises(ValueError, match="ended at step 3: nothing left before step 3"):
        train(cli_config(base_argv(tiny_model_dir, data_files, tmp_path / "z", "--max_steps", "8", "--last_step", "3",
                                   "--continue_from", str(first))))
    with pytest.raises(ValueError, match="not a finished training run"):
        train(cli_config(base_argv(tiny_model_dir, data_files, tmp_path / "w", "--max_steps", "8",
                                   "--continue_from", str(tmp_path / "missing"))))
    with pytest.raises(ValueError, match=r"--last_step 9 is past the end of the schedule \(8 steps\)"):
        train(cli_config(base_argv(tiny_model_dir, data_files, tmp_path / "v", "--max_steps", "8", "--last_step", "9")))


def test_resume_after_sigkill_matches_uninterrupted_run(tiny_model_dir, data_files, reference_run, tmp_path):
    ref_out, _ = reference_run
    out = tmp_path / "killed"
    argv = base_argv(tiny_model_dir, data_files, out, "--save_steps", "2", "--save_total_limit", "0")
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *argv, "--log_level", "WARNING"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if list_checkpoints(out) and int(list_checkpoints(out)[-1].name.split("-")[1]) >= 2:
            break  # kill it in the middle of the next step
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert not (out / "training_args.json").exists() or "result" not in read_json(out / "training_args.json")
    killed_at = int(list_checkpoints(out)[-1].name.split("-")[1])
    assert 2 <= killed_at < 8
    result = train(cli_config(argv + ["--resume"]))
    assert result["status"] == "finished"
    ref, got = adapter_tensors(ref_out), adapter_tensors(out)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=0)
    assert [r["step"] for r in read_jsonl(out / "train_log.jsonl")] == list(range(1, 9))


def test_a_resume_with_other_settings_is_refused_in_one_line(tiny_model_dir, data_files, reference_run, tmp_path):
    """Issue 44: --resume of a finished folder with another --lr said "training already finished" and kept the old
    weights (the driver's FORCE=1 LR=5e-4 then described them as trained with 5e-4); an unfinished one resumed under
    the new temperature. Now both stop before any work with one line naming each difference, the folder untouched."""
    ref_out, _ = reference_run
    weights = ref_out / "adapter_model.safetensors"
    before = hashlib.sha256(weights.read_bytes()).hexdigest()
    argv = base_argv(tiny_model_dir, data_files, ref_out, "--save_steps", "4", "--resume", "--lr", "5e-4",
                     "--seed", "6", "--mini_batch_size", "2", "--device", "cpu")  # the last two change no weight
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")] == [
        f"error: {ref_out}: cannot --resume a run made with other settings (lr: the folder was trained with 0.002, "
        "now 0.0005; seed: the folder was trained with 5, now 6); rerun with its settings, or start over with "
        "--overwrite_output_dir or a new --output_dir"]
    assert "already finished" not in proc.stdout + proc.stderr and proc.stdout == ""
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == before

    stopped = tmp_path / "stopped"
    argv = base_argv(tiny_model_dir, data_files, stopped, "--save_steps", "1")
    assert train(cli_config(argv + ["--stop_after_steps", "1"]))["status"] == "stopped"
    with pytest.raises(ValueError, match=r"\(temperature: the folder was trained with 0\.05, now 0\.1\)"):
        train(cli_config(argv + ["--resume", "--temperature", "0.1"]))
    assert [r["step"] for r in read_jsonl(stopped / "train_log.jsonl")] == [1]


def test_init_adapter_continues_from_the_previous_adapter(tiny_model_dir, data_files, reference_run, tmp_path):
    ref_out, _ = reference_run
    # lr 0: the continued run must end exactly where the previous adapter was
    argv = base_argv(tiny_model_dir, data_files, tmp_path / "iter2", "--init_adapter", str(ref_out), "--lr", "0",
                     "--max_steps", "2", "--save_steps", "0")
    result = train(cli_config(argv))
    assert result["step"] == 2
    ref, got = adapter_tensors(ref_out), adapter_tensors(tmp_path / "iter2")
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=0, rtol=0)
    assert read_json(tmp_path / "iter2" / "adapter_config.json")["base_model_name_or_path"] == str(tiny_model_dir)


def test_full_finetune_folder_loads_with_retriever_load(tiny_model_dir, data_files, tmp_path):
    out = tmp_path / "full"
    result = train(cli_config(base_argv(tiny_model_dir, data_files, out, "--full_finetune", "--max_steps", "2",
                                        "--save_steps", "0", "--lr", "1e-3")))
    assert result["step"] == 2 and (out / "model.safetensors").exists()
    assert not (out / "adapter_config.json").exists() and training_finished(out)
    tuned = Retriever.load(str(out), max_length=64)
    base = Retriever.load(str(tiny_model_dir), max_length=64)
    texts = ["iron zinc gold", "omega psi chi"]
    assert tuned.pooling == "eos"
    assert not torch.allclose(tuned.encode_queries(texts), base.encode_queries(texts), atol=1e-4)
    ckpt = list_checkpoints(out)[-1]
    weights = torch.load(ckpt / "trainable.pt", weights_only=True)
    from safetensors.torch import load_file

    saved = load_file(str(out / "model.safetensors"))
    key = next(k for k in saved if k.endswith("layers.0.self_attn.q_proj.weight"))
    torch.testing.assert_close(saved[key], weights[key], atol=0, rtol=0)


def test_full_finetune_schedule_continued_from_the_saved_model_ends_as_one_run(tiny_model_dir, data_files, tmp_path):
    """The driver's SCHEDULE=one with full fine-tuning: the continued run is given the first run's saved model folder
    as --model (what the driver's diagnosis used) and ends with the weights of one uninterrupted 4-step run."""
    from safetensors.torch import load_file

    flags = ["--full_finetune", "--max_steps", "4", "--save_steps", "0", "--lr", "1e-3"]
    whole, first, second = tmp_path / "whole", tmp_path / "first", tmp_path / "second"
    train(cli_config(base_argv(tiny_model_dir, data_files, whole, *flags)))
    train(cli_config(base_argv(tiny_model_dir, data_files, first, *flags, "--last_step", "2")))
    argv = base_argv(tiny_model_dir, data_files, second, *flags, "--continue_from", str(first))
    argv[argv.index("--model") + 1] = str(first)
    assert train(cli_config(argv))["step"] == 4
    ref, got = load_file(str(whole / "model.safetensors")), load_file(str(second / "model.safetensors"))
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=0)


def _tiny_bert(folder: Path) -> Path:
    """A random 2-layer BERT with all-MiniLM-L6-v2's real WordPiece tokenizer (mean pooling profile)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from repair.models import minilm_folder

    tok = AutoTokenizer.from_pretrained(minilm_folder())
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_encoder_lora_targets_and_mean_pooling(data_files, tmp_path):
    bert = _tiny_bert(tmp_path / "bert")
    out = tmp_path / "bert_lora"
    result = train(cli_config(base_argv(bert, data_files, out, "--max_steps", "2", "--save_steps", "0")))
    assert result["step"] == 2
    assert set(read_json(out / "adapter_config.json")["target_modules"]) == {"query", "key", "value", "dense"}
    args = read_json(out / "training_args.json")
    assert args["pooling"] == "mean" and args["instruction_used"] == ""
    loaded = Retriever.load(str(bert), adapter=str(out), max_length=64)
    assert loaded.pooling == "mean"
    assert loaded.encode_queries(["iron zinc"]).shape == (1, 32)


def test_bad_lora_target_is_a_clear_error(tiny_model_dir, data_files, tmp_path):
    with pytest.raises(ValueError, match="match no linear layer"):
        train(cli_config(base_argv(tiny_model_dir, data_files, tmp_path / "x", "--lora_target_modules", "query")))


def test_gradient_checkpointing_auto_is_on_for_cpu_where_the_model_supports_it(tiny_model_dir):
    """auto checkpoints on CPU too (the demo's memory); a model without support trains without it, and an
    explicit ``on`` for such a model is a clear error instead of an AttributeError deep in the model."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_model_dir)
    assert cli_config(["--output_dir", "x"]).gradient_checkpointing == "auto"
    assert uses_activation_checkpointing(TrainConfig(output_dir="x"), model)
    assert not uses_activation_checkpointing(TrainConfig(output_dir="x", gradient_checkpointing="off"), model)
    unsupported = torch.nn.Linear(2, 2)
    assert not uses_activation_checkpointing(TrainConfig(output_dir="x"), unsupported)
    with pytest.raises(ValueError, match="Linear does not support gradient checkpointing"):
        uses_activation_checkpointing(TrainConfig(output_dir="x", gradient_checkpointing="on"), unsupported)


@pytest.mark.slow
def test_torchrun_two_cpu_ranks_train_like_one_process(tiny_model_dir, data_files, tmp_path):
    """The CLI under torchrun (gloo): 2 ranks, gathered negatives, summed gradients, rank-0 checkpoints. Without
    dropout the adapter equals a one-process run of the same global batches."""
    common = ["--lora_dropout", "0", "--max_steps", "3", "--save_steps", "2"]
    single = tmp_path / "single"
    train(cli_config(base_argv(tiny_model_dir, data_files, single, *common)))
    multi = tmp_path / "multi"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    import socket

    with socket.socket() as sock:  # a free port (torchrun's static rendezvous does not take port 0)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(port), str(SCRIPT),
                           *base_argv(tiny_model_dir, data_files, multi, *common), "--log_level", "WARNING"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "finished"
    assert read_json(multi / "training_args.json")["world_size"] == 2
    assert sorted(p.name for p in (list_checkpoints(multi)[-1]).glob("rng-rank*.pt")) == ["rng-rank0.pt",
                                                                                       "rng-rank1.pt"]
    ref, got = adapter_tensors(single), adapter_tensors(multi)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=1e-4)
    assert [r["step"] for r in read_jsonl(multi / "train_log.jsonl")] == [1, 2, 3]
    single_log, multi_log = read_jsonl(single / "train_log.jsonl"), read_jsonl(multi / "train_log.jsonl")
    for a, b in zip(single_log, multi_log):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)


class _NotAllowed:  # a pickled class: what weights_only loading refuses
    pass


def test_a_checkpoint_refused_by_weights_only_is_named(tiny_model_dir, data_files, tmp_path):
    """Resuming from a checkpoint file that holds more than tensors stops with the file's path in one line (issue 18:
    the bare torch message is a paragraph about trusting the source, with no path)."""
    argv = base_argv(tiny_model_dir, data_files, tmp_path / "run", "--save_steps", "1")
    assert train(cli_config(argv + ["--stop_after_steps", "1"]))["status"] == "stopped"
    ckpt = list_checkpoints(tmp_path / "run")[-1]
    torch.save({"rng": _NotAllowed()}, ckpt / "scheduler.pt")
    with pytest.raises(DataError) as exc:
        train(cli_config(argv + ["--resume"]))
    assert str(ckpt / "scheduler.pt") in str(exc.value) and "\n" not in str(exc.value)


def test_training_defaults_are_written_once_and_qem_is_causalneg_only():
    """Every training default lives in TrainConfig: 10's flags and the driver's settings (its table and the values it
    computes per NEGATIVES) read it, so they cannot drift apart. QEM is off by default (REPAIR's training is plain
    InfoNCE) and CausalNeg's 0.1 is what the driver passes for NEGATIVES=causalneg."""
    from repair.models import DEFAULT_MODEL
    from repair.driver.settings import resolve

    cfg = TrainConfig(output_dir="out")
    assert cli_config(["--output_dir", "out"]) == cfg
    assert cfg.model == DEFAULT_MODEL and cfg.qem_lambda == 0.0 and CAUSALNEG_QEM_LAMBDA == 0.1
    for negatives, qem_lambda, hard_negatives in (("repair", cfg.qem_lambda, cfg.num_hard_negatives),
                                                  ("causalneg", CAUSALNEG_QEM_LAMBDA, -1)):
        v = resolve({"TRAIN_DATA": "t0.jsonl", "NEGATIVES": negatives}, ROOT).values
        assert (float(v["QEM_LAMBDA"]), int(v["NUM_HARD_NEG"])) == (qem_lambda, hard_negatives), negatives
        assert v["MODEL"] == DEFAULT_MODEL
        driver = (int(v["EPOCHS"]), float(v["LR"]), float(v["TEMPERATURE"]), int(v["GLOBAL_BATCH"]),
                  int(v["MINI_BATCH"]), float(v["WARMUP_RATIO"]), float(v["QEM_TAU"]), int(v["MAX_LENGTH"]))
        assert driver == (cfg.epochs, cfg.lr, cfg.temperature, cfg.global_batch_size, cfg.mini_batch_size,
                          cfg.warmup_ratio, cfg.qem_tau, cfg.max_length)
