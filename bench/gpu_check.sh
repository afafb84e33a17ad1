#!/usr/bin/env bash
# One-call GPU check of REPAIR's CUDA paths (issue 18 item 5): encoder tokens/s + MFU (bf16) on a random
# Qwen2.5-0.5B-shaped model, a LoRA + GradCache + gradient-checkpointing training step, exact search on the
# GPU vs the CPU, and `DEMO=tiny DEVICE=cuda bash run_repair.sh`. Prints one JSON summary on stdout; needs
# only this repo and its install (no network). Under 8 minutes with the defaults.
#
#   bash bench/gpu_check.sh [--dry_run] [--skip demo,search] [--out FILE.json] [--timeout_s 450] [--help]
#
# Without a CUDA GPU it checks its arguments, prints {"cuda": false, ...} and exits 0.
# Exit codes: 0 ok, 1 a section failed or timed out (its error text is in the JSON), 2 bad arguments.
# PYTHON picks the interpreter [.venv/bin/python if present, else python3].
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
exec "$PYTHON" "$HERE/gpu_check.py" "$@"
