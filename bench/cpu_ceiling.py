#!/usr/bin/env python
"""What this CPU can do at most for generation (issue 33): memory bandwidth and GEMM throughput, one thread.

Three numbers bound any engine on a CPU: how fast weights stream from memory (each decoding step reads every
weight once, whatever the batch), how fast fp32 GEMMs run (transformers' prefill), and how fast int8 GEMMs run
(an int8 engine's prefill). Measured here with plain numpy / torch kernels, each the best of ``--repeat`` runs:
  copy    numpy copy of a 512 MiB float32 array (bytes read + written per second)
  read    torch sum of the same array (bytes read per second: a decoding step's pattern)
  fp32    torch.matmul of (M x K) @ (K x N) float32, K = N = 1536 (Qwen2.5-1.5B's hidden size), M = 128
  int8    the same product as a dynamically quantised int8 linear layer (torch.ao, fbgemm: int8 weights and
          activations, int32 accumulation, AVX512-VNNI where the CPU has it), quantisation of x included
Prints one JSON object; ``--out`` also writes it.
    OMP_NUM_THREADS=1 python bench/cpu_ceiling.py --out runs/cpu_ceiling.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(threads: int, repeat: int, m: int = 128, k: int = 1536, n: int = 1536) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    a = np.ones((128 << 20,), dtype=np.float32)  # 512 MiB
    b = np.empty_like(a)
    copy_s = best_of(lambda: np.copyto(b, a), repeat)
    at = torch.from_numpy(a)
    read_s = best_of(lambda: at.sum(), repeat)
    x, w = torch.randn(m, k), torch.randn(k, n)
    fp32_s = best_of(lambda: [torch.matmul(x, w) for _ in range(20)], repeat) / 20
    out = {"threads": threads, "copy_gb_s": round(2 * a.nbytes / copy_s / 1e9, 2),
           "read_gb_s": round(a.nbytes / read_s / 1e9, 2),
           "fp32_gflop_s": round(2 * m * k * n / fp32_s / 1e9, 1), "gemm_shape": [m, k, n]}
    try:
        layer = torch.ao.nn.quantized.dynamic.Linear(k, n, dtype=torch.qint8)
        int8_s = best_of(lambda: [layer(x) for _ in range(20)], repeat) / 20
        out["int8_gop_s"] = round(2 * m * k * n / int8_s / 1e9, 1)
    except (RuntimeError, AttributeError) as exc:  # not every torch build has an int8 CPU kernel
        out["int8_gop_s"] = None
        out["int8_note"] = str(exc).splitlines()[0][:200]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, nargs="+", default=[1], help="thread counts (default: 1)")
    p.add_argument("--repeat", type=int, default=5, help="runs per measurement, the best kept (default: 5)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    result = {"load_avg_before": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
              "rows": [measure(t, args.repeat) for t in args.threads]}
    result["load_avg_after"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.out + ".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
