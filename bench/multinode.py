#!/usr/bin/env python
"""10's optimizer step time and 07's encoding throughput for 1 node x 1 process, 1 node x 2 processes and 2 "nodes"
x 1 process (two torchrun launchers meeting in a c10d rendezvous on 127.0.0.1, gloo), launched with the lines
repair/driver/launch.py builds for the driver (issue 42). Each training rank also times the collectives the trainer
calls (all_gather of the embeddings, all_reduce of the gradients, broadcast, barrier) and counts the bytes they move,
so the table gives the communication share of a step and the bytes a step exchanges: what GPU scaling is estimated
from on paper.

Example (minutes on 2 CPU cores; the table in docs/benchmarks.md):
  python bench/multinode.py --model smollm2-135m --steps 4 --global_batch_size 16 --texts 256
"""

from __future__ import annotations

import argparse
import json
import os
import random
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "training" / "10_train_lora.py"
EMBED = ROOT / "differentiation" / "07_embed_candidates.py"
LAYOUTS = ((1, 1), (1, 2), (2, 1))  # (nodes, processes per node)
WORDS = ("perovskite anatase rutile graphene lithium cathode anode zeolite catalyst dopant band gap film oxide "
         "nitride sulfide polymer electrolyte membrane photocatalysis conductivity stability annealing sintering "
         "grain boundary vacancy lattice strain phonon exciton carrier mobility").split()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="retriever backbone (default: %(default)s)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps; the first is not timed (default: %(default)s)")
    p.add_argument("--global_batch_size", type=int, default=16, help="queries per step (default: %(default)s)")
    p.add_argument("--mini_batch_size", type=int, default=8, help="GradCache chunk (default: %(default)s)")
    p.add_argument("--max_length", type=int, default=64, help="tokens per text (default: %(default)s)")
    p.add_argument("--texts", type=int, default=256, help="07: about this many distinct texts (default: %(default)s)")
    p.add_argument("--output", default=None, help="also write the results JSON here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a timed rank: write its collectives here
    return p.parse_known_args(argv)[0]


# ---------------------------------------------------------------------------------------------- a timed rank
def timed_rank(out: str, script_argv: list[str]) -> None:
    """Run a script as this torchrun rank with torch.distributed's collectives timed and their bytes counted."""
    import torch
    import torch.distributed as dist

    import repair.training.trainer as trainer

    stats = {"seconds": 0.0, "bytes": 0, "calls": 0, "steps": []}  # collectives inside optimizer steps only
    in_step = [False]

    def nbytes(obj) -> int:
        if isinstance(obj, torch.Tensor):
            return obj.numel() * obj.element_size()
        return sum(nbytes(t) for t in obj) if isinstance(obj, (list, tuple)) else 0

    def wrap(name: str, received) -> None:
        original = getattr(dist, name)

        def timed(*args, **kwargs):
            if not in_step[0]:  # setup (weights broadcast, folder barriers) and checkpoints are not a step's
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                stats["seconds"] += time.perf_counter() - t0
                stats["bytes"] += received(args)
                stats["calls"] += 1
        setattr(dist, name, timed)

    step = trainer.optimizer_step

    def timed_step(*args, **kwargs):
        before = (stats["seconds"], stats["bytes"])
        in_step[0], t0 = True, time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            in_step[0] = False
            stats["steps"].append({"seconds": time.perf_counter() - t0, "comm_seconds": stats["seconds"] - before[0],
                                   "comm_bytes": stats["bytes"] - before[1]})
    trainer.optimizer_step = timed_step

    wrap("all_gather", lambda a: nbytes(a[0]))  # what this rank receives (every rank's block)
    wrap("all_reduce", lambda a: nbytes(a[0]))
    wrap("broadcast", lambda a: nbytes(a[0]))
    wrap("barrier", lambda a: 0)
    sys.argv = script_argv
    try:
        runpy.run_path(script_argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        Path(f"{out}.rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(stats))


# ---------------------------------------------------------------------------------------------- the runs
def launch_lines(nodes: int, nproc: int) -> list[list[str]]:
    from repair.driver.launch import launch_prefix, resolve_launch
    from repair.runtime import free_port

    port = free_port()
    lines = []
    for node in range(nodes):
        env = {"NNODES": str(nodes), "NPROC": str(nproc), "NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        line = launch_prefix(resolve_launch(env), sys.executable)
        if "--standalone" in line:  # a pinned port instead of --standalone's (other jobs share this machine)
            i = line.index("--standalone")
            line[i:i + 1] = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]
        lines.append(line)
    return lines


def run(nodes: int, nproc: int, script_argv: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs = [subprocess.Popen([*line, *script_argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for line in launch_lines(nodes, nproc)]
    for proc in procs:
        _, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"{nodes}x{nproc} failed: {err[-2000:]}")


def synthetic_data(folder: Path, n_pairs: int, n_tuples: int) -> tuple[Path, Path]:
    rng = random.Random(0)
    sentence = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))  # noqa: E731
    t0 = folder / "t0.jsonl"
    t0.write_text("".join(json.dumps({"query": sentence(8), "positive": sentence(40)}) + "\n" for _ in range(n_pairs)))
    exp = folder / "expansion.jsonl"
    rows = []
    for i in range(n_tuples):
        rows.append({"id": f"r{i}", "q_new": sentence(10), "d_pos": sentence(40), "concepts": [],
                     "pos_meta": {"id": f"p{i}", "title": sentence(6)},
                     "negative_candidates": [{"id": f"n{i}-{j}", "title": sentence(6), "abstract": sentence(40)}
                                             for j in range(6)]})
    exp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return t0, exp


def bench(args) -> dict:
    from repair.data import read_json

    tmp = Path(tempfile.mkdtemp(prefix="bench_multinode."))
    t0, exp = synthetic_data(tmp, args.global_batch_size * args.steps, max(1, args.texts // 8))
    results = []
    for nodes, nproc in LAYOUTS:
        tag = f"{nodes}x{nproc}"
        out, comm = tmp / f"train-{tag}", tmp / f"comm-{tag}"
        train_argv = [str(TRAIN), "--model", args.model, "--train_data", str(t0), "--output_dir", str(out),
                      "--global_batch_size", str(args.global_batch_size), "--mini_batch_size",
                      str(args.mini_batch_size), "--max_length", str(args.max_length), "--max_steps", str(args.steps),
                      "--save_steps", "0", "--lora_dropout", "0", "--device", "cpu", "--no_progress",
                      "--log_level", "WARNING"]
        run(nodes, nproc, [str(Path(__file__).resolve()), "--worker", str(comm), "--", *train_argv])
        ranks = [json.loads(p.read_text()) for p in sorted(tmp.glob(f"comm-{tag}.rank*.json"))]
        timed = [r["steps"][1:] for r in ranks]  # the first step warms up
        step_s = median(max(s[i]["seconds"] for s in timed) for i in range(len(timed[0])))
        comm_s = median(max(s[i]["comm_seconds"] for s in timed) for i in range(len(timed[0])))
        comm_bytes = max(s[-1]["comm_bytes"] for s in timed)
        emb = tmp / f"emb-{tag}"
        embed_argv = [str(EMBED), "--input_jsonl", str(exp), "--output_dir", str(emb), "--model", args.model,
                      "--device", "cpu", "--max_length", str(args.max_length), "--batch_size", "16",
                      "--log_level", "WARNING"]
        run(nodes, nproc, embed_argv)
        meta = read_json(emb / "meta.json")
        row = {"layout": tag, "ranks": nodes * nproc, "step_seconds": round(step_s, 3),
               "comm_seconds_per_step": round(comm_s, 3), "comm_share": round(comm_s / max(step_s, 1e-9), 3),
               "bytes_per_step_per_rank": int(comm_bytes), "embed_texts": meta["texts_forwarded"],
               "embed_seconds": meta["seconds"], "embed_texts_per_s": round(meta["texts_forwarded"] / meta["seconds"], 1)}
        print(json.dumps(row), flush=True)
        results.append(row)
    return {"model": args.model, "global_batch_size": args.global_batch_size, "mini_batch_size": args.mini_batch_size,
            "max_length": args.max_length, "steps": args.steps, "rows": results}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:
        i, j = argv.index("--worker"), argv.index("--")
        timed_rank(argv[i + 1], argv[j + 1:])
        return
    args = parse_args(argv)
    result = bench(args)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
