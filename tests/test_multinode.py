"""Two "nodes" on this machine (issue 42): two torchrun launchers, ``--nnodes 2 --nproc_per_node 1``, meeting in a
c10d rendezvous on 127.0.0.1 (gloo, CPU), started with the lines :mod:`repair.driver.launch` builds for node 0 and
for the other node. 10's adapter and loss trajectory equal a one-node, two-process run's; 07's embedding dir equals a
single process's (its encoding sharded over both nodes' ranks, rank 0 writing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_train import synthetic_pairs, write_jsonl
from repair.data import read_json, read_jsonl
from repair.driver.launch import launch_prefix, resolve_launch
from repair.runtime import free_port
from repair.training.trainer import list_checkpoints

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "training" / "10_train_lora.py"
EMBED = ROOT / "differentiation" / "07_embed_candidates.py"
FIXTURE = ROOT / "tests" / "fixtures" / "expansion_tiny.jsonl"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def quiet_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_two_nodes(script: Path, args: list[str]) -> list[str]:
    """The script on 2 nodes x 1 process: node 0's and node 1's launch lines, as the driver and the .peer.cmd file
    have them, started side by side; returns each launcher's stdout (both must succeed)."""
    port = free_port()
    lines = []
    for node in (0, 1):
        launch = resolve_launch({"NNODES": "2", "NPROC": "1", "NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1",
                                 "MASTER_PORT": str(port)})
        lines.append(launch_prefix(launch, sys.executable))
    assert lines[0][lines[0].index("--rdzv_endpoint") + 1] == f"127.0.0.1:{port}"
    procs = [subprocess.Popen([*line, str(script), *args], env=quiet_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for line in lines]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outs.append(out)
    return outs


def run_one_node(script: Path, args: list[str], nproc: int) -> str:
    launch = resolve_launch({"NPROC": str(nproc)})
    cmd = [*launch_prefix(launch, sys.executable), str(script), *args]
    if nproc > 1:  # --standalone picks its own port; pin one free now instead (parallel test runs)
        cmd[cmd.index("--standalone")] = f"--rdzv_endpoint=127.0.0.1:{free_port()}"
        cmd[3:3] = ["--rdzv_backend", "c10d"]
    proc = subprocess.run(cmd, env=quiet_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def train_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mn_data")
    t0 = write_jsonl(folder / "t0.jsonl", synthetic_pairs(8, seed=1))
    rows = []
    for i, r in enumerate(synthetic_pairs(4, seed=2)):
        negs = [p["positive"] for p in synthetic_pairs(2, seed=100 + i)]
        rows.append({"query": r["query"], "pos_document": r["positive"], "hard_negatives": negs,
                     "hard_negative_scores": [0.9, 0.8], "d_neg": negs[0], "pos_rank": 1, "id": str(i),
                     "concepts": [], "negative_sources": ["mined", "generated"]})
    return t0, write_jsonl(folder / "final_train_data.bottom_30pct.jsonl", rows)


def train_args(model_dir, files, out: Path) -> list[str]:
    t0, trip = files
    return ["--model", str(model_dir), "--train_data", t0, "--triplets", trip, "--num_hard_negatives", "-1",
            "--output_dir", str(out), "--global_batch_size", "4", "--mini_batch_size", "2", "--max_length", "48",
            "--lr", "2e-3", "--temperature", "0.05", "--lora_r", "4", "--lora_alpha", "8", "--seed", "5",
            "--lora_dropout", "0", "--max_steps", "3", "--save_steps", "2", "--no_progress", "--log_level", "WARNING"]


def adapter(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_10_on_two_nodes_trains_like_one_node_with_two_processes(tiny_model_dir, train_files, tmp_path):
    one, two = tmp_path / "1x2", tmp_path / "2x1"
    run_one_node(TRAIN, train_args(tiny_model_dir, train_files, one), nproc=2)
    outs = run_two_nodes(TRAIN, train_args(tiny_model_dir, train_files, two))
    summaries = [json.loads(o.strip().splitlines()[-1]) for o in outs if o.strip()]
    assert [s["status"] for s in summaries] == ["finished"]  # global rank 0 alone prints the summary
    assert read_json(two / "training_args.json")["world_size"] == 2
    # both nodes' ranks put their RNG state into the one checkpoint rank 0 renamed into place
    ckpts = list_checkpoints(two)
    assert [read_json(c / "state.json")["step"] for c in ckpts] == [2, 3]
    assert sorted(p.name for p in ckpts[-1].glob("rng-rank*.pt")) == ["rng-rank0.pt", "rng-rank1.pt"]
    ref, got = adapter(one), adapter(two)
    assert ref.keys() == got.keys() and ref
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=1e-4)
    ref_log, got_log = read_jsonl(one / "train_log.jsonl"), read_jsonl(two / "train_log.jsonl")
    assert [r["step"] for r in got_log] == [1, 2, 3]
    assert [r["loss"] for r in got_log] == pytest.approx([r["loss"] for r in ref_log], abs=1e-5)
    assert got_log[-1]["loss"] != got_log[0]["loss"]  # it trained


def test_07_on_two_nodes_writes_the_single_process_embedding_dir(tiny_model_dir, tmp_path):
    args = ["--input_jsonl", str(FIXTURE), "--model", str(tiny_model_dir), "--device", "cpu", "--log_level", "WARNING"]
    run_one_node(EMBED, [*args, "--output_dir", str(tmp_path / "one")], nproc=1)
    outs = run_two_nodes(EMBED, [*args, "--output_dir", str(tmp_path / "two")])
    assert sum("07:" in o for o in outs) == 1  # rank 0 reports, once
    meta = read_json(tmp_path / "two" / "meta.json")
    assert meta["processes"] == 2 and meta["texts_forwarded"] == 16  # each text once, over both nodes
    assert len(list((tmp_path / "two" / "cache").rglob("shard-*.keys.npy"))) >= 2  # both nodes' ranks encoded
    for name in ("queries", "documents"):
        assert read_jsonl(tmp_path / "two" / f"{name}.jsonl") == read_jsonl(tmp_path / "one" / f"{name}.jsonl")
        np.testing.assert_array_equal(np.load(tmp_path / "two" / f"{name}.sha1.npy"),
                                      np.load(tmp_path / "one" / f"{name}.sha1.npy"))
        np.testing.assert_allclose(np.load(tmp_path / "two" / f"{name}.npy"),
                                   np.load(tmp_path / "one" / f"{name}.npy"), atol=1e-6)


def test_shared_cache_waits_for_shards_another_node_writes_late(tmp_path):
    """07's ranks exchange vectors through the embedding cache; on a network filesystem another node's shard can
    appear in a listing late: the reader waits for it, and names the shared-folder requirement if it never comes."""
    import threading

    from repair.encoding import EmbeddingCache

    reader, writer = EmbeddingCache(tmp_path, "fp"), EmbeddingCache(tmp_path, "fp")
    keys = [b"a" * 40, b"b" * 40]
    late = threading.Timer(0.6, writer.put, args=(keys, np.ones((2, 3), dtype=np.float32)))
    late.start()
    reader.wait_for(keys, timeout=30)
    late.join()
    np.testing.assert_array_equal(reader.get(keys), np.ones((2, 3), dtype=np.float32))
    with pytest.raises(RuntimeError, match="still not visible after 0.6 s; every node of a multi-node run must "
                                           "share this folder"):
        reader.wait_for([b"c" * 40], timeout=0.6)


FAKE_SRUN = '''#!{python}
"""srun as a test stand-in: --ntasks=N copies of the command, SLURM_NODEID/SLURM_PROCID 0..N-1, side by side."""
import os, subprocess, sys
args = sys.argv[1:]
with open({log!r}, "a") as fh:
    fh.write(" ".join(args) + "\\n")
flags = []
while args and args[0].startswith("--"):
    flags.append(args.pop(0))
tasks = int(next(f.split("=")[1] for f in flags if f.startswith("--ntasks=")))
procs = [subprocess.Popen(args, env={{**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i)}})
         for i in range(tasks)]
sys.exit(max(p.wait() for p in procs))
'''


def test_driver_inside_a_2_node_slurm_job_runs_10_and_07_on_both_nodes(tiny_model_dir, tmp_path):
    """run_repair.sh in a fake 2-node Slurm job (SLURM_* variables, a fake scontrol naming this host first and an
    srun that starts its tasks here): 07 and 10 run as srun -> torchrun --nnodes 2 over both "nodes", the rest on
    node 0; the run finishes with 2-rank training and a 2-rank embedding dir."""
    from test_driver import driver_env, make_corpus, reply_for

    from helpers_sources import FakeServer, openai_route

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun_log = tmp_path / "srun.log"
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable, log=str(srun_log)))
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames n[1-2]" ] && '
                                      'printf "localhost\\nn2\\n"\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    data = make_corpus(tmp_path / "matsci")
    with FakeServer(openai_route(reply_for, model="fake-generator")) as server:
        env = driver_env(tmp_path, tiny_model_dir, data, server.url, "run")
        env = {k: v for k, v in env.items() if k not in ("NNODES", "NPROC", "NODE_RANK", "MASTER_ADDR")}
        env.update(ITERS="1", EVAL_DATA="", PATH=f"{bin_dir}:{env['PATH']}", SLURM_JOB_ID="77", SLURM_NNODES="2",
                   SLURM_JOB_NODELIST="n[1-2]", SLURM_NODEID="0", MASTER_PORT=str(free_port()))
        proc = subprocess.run(["bash", str(ROOT / "run_repair.sh")], env=env, capture_output=True, text=True,
                              cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "run"
    assert "training and 07: torchrun on 2 nodes x 1 processes = 2 ranks, rendezvous localhost:" in proc.stdout
    launches = srun_log.read_text().splitlines()
    assert len(launches) == 2 and [("07_embed_candidates.py" in l, "10_train_lora.py" in l) for l in launches] == [
        (True, False), (False, True)]
    for name in ("iter1.07_embed", "iter1.10_train"):
        cmd = (run / "logs" / f"{name}.cmd").read_text().split()
        assert cmd[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                           sys.executable]
        assert cmd[cmd.index("--rdzv_endpoint") + 1] == f"localhost:{env['MASTER_PORT']}"
    assert read_json(run / "iter1" / "differentiation" / "embeddings" / "meta.json")["processes"] == 2
    assert read_json(run / "iter1" / "adapter" / "training_args.json")["world_size"] == 2
    assert (run / "iter1" / "adapter" / "adapter_model.safetensors").exists()
