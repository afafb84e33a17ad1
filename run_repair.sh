#!/usr/bin/env bash
#SBATCH --job-name=repair
#SBATCH --nodes=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=48:00:00
#SBATCH --output=repair-%j.out
#
# REPAIR driver: Diagnosis -> Expansion -> Differentiation -> Training -> Evaluation, ITERS times.
#
#   bash run_repair.sh                 # offline demo (SmolLM2-135M, shipped SciFact slice), ~15 min on 2 CPU cores
#   DEMO=tiny bash run_repair.sh       # smaller demo, ~4 min
#   sbatch run_repair.sh               # on a Slurm node (the #SBATCH lines above; edit or override them)
#   MODEL=Qwen/Qwen2.5-0.5B TRAIN_DATA=seed.pt EVAL_DATA="nfcorpus:ir:/data/nfcorpus" OUT_DIR=runs/q05 bash run_repair.sh
#   bash run_repair.sh --help          # this text
#
# Every setting is an environment variable (default in brackets). A rerun skips finished steps and resumes
# unfinished ones (05/06 and training resume from where they stopped); FORCE=1 redoes everything.
# Layout: $OUT_DIR/iter{k}/{diagnosis,expansion,differentiation,adapter,eval}, logs in $OUT_DIR/logs,
# the report in $OUT_DIR/report.md.
#
# Run
#   OUT_DIR         run folder [runs/demo | runs/demo-tiny]
#   ITERS           iterations [2]
#   DEMO            demo size when TRAIN_DATA is unset: full | tiny [full]
#   FORCE           1 = redo finished steps [0]
#   PYTHON          interpreter [.venv/bin/python if present, else python3]
#   DEVICE          cpu | cuda | cuda:N [auto]
#   NPROC           processes for torchrun (training) and for 07's encoding; >1 is opt-in multi-GPU [1]
#   SEED            seed for generation, sampling and training [42]
# Model
#   MODEL           retriever backbone: HF id, folder, alias smollm2-135m | minilm [smollm2-135m]
#   ADAPTER         LoRA adapter to start from (iteration 1) [none]
#   MAX_LENGTH      tokens per text incl. EOS [512; demo 128]
#   BATCH_SIZE      encoding batch size [32]
# Data
#   TRAIN_DATA      T0: original .pt, JSONL {query, positive}, or BEIR folder [data/demo/scifact-demo]
#   TRAIN_SPLIT     BEIR split of T0 [train]
#   EVAL_DATA       space-separated eval specs PATH | TASK:PATH | NAME:TASK:PATH [the demo folder + data/biosses]
#   EVAL_SPLIT      split evaluated on BEIR folders [test]
# Diagnosis (Stage I)
#   PCT             bottom percentile of margins = Q_conf [30]
#   DIA_TOP_K       top-k searched per query for the margin [50]
#   TOP_NEG_N       D-(q): first non-positive hits per confused query [30]
#   EXTRACTOR       concept extractor: regex | matdetector [regex]
#   NER_MODEL       token-classification model for EXTRACTOR=matdetector [yerim0210/MatDetector]
# Expansion (Stage II)
#   SOURCE          literature source: local | semantic_scholar | elsevier [local]
#   LOCAL_CORPUS    BEIR folder or JSONL {id,title,abstract} for SOURCE=local [TRAIN_DATA when it is a folder]
#   S2_KEY_FILE     Semantic Scholar keys, one per line (or $S2_API_KEY) []
#   ELSEVIER_KEY_FILE  Elsevier keys, one per line (or $ELSEVIER_API_KEY / $ELSEVIER_INSTTOKEN) []
#   GROUNDING       none | pubchem | mp | both (mp needs $MP_API_KEY) [none]
#   GENERATOR       hf | openai [hf]
#   GEN_MODEL       generator model for hf [MODEL]; for openai: $OPENAI_MODEL or the server's first model
#   GEN_ADAPTER     hf generator's LoRA: auto = the retriever's current adapter when GEN_MODEL is MODEL (the
#                   paper: M_theta writes the queries), none = the plain generator, or an adapter folder [auto]
#   OPENAI_URL      OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama) [$OPENAI_BASE_URL]
#   TARGET_K        max negative candidates per verified query [20]
#   VALID_FACTOR    stop expansion at VALID_FACTOR x |T0| valid tuples [2]
#   GEN_ROUND       queries generated per 05 -> 06 round [max(16, |T0|)]
#   MAX_ROUNDS      round limit of the 05 -> 06 loop [6; demo 3]
# Differentiation (Stage III)
#   TOP_K           hard negatives kept per tuple (Eq. 7) [15]
#   CONSISTENCY_K   keep a tuple if rank(d+) <= kappa in its pool (Eq. 6) [5]
#   POOL            local (README) | global (original code) [local]
#   NEGATIVES       repair | causalneg (adds CoT counterfactual negatives + QEM) [repair]
#   CN_K            generated counterfactual negatives per query for NEGATIVES=causalneg [3]
#   CN_RATIO        share of the kept tuples that get generated negatives (Sec. 4.5) [1.0]
#   CN_EXTRA        extra flags for differentiation/09b_counterfactual_negatives.py []
# Training
#   EPOCHS [2; demo 1]  LR [2e-5; demo 1e-4]  TEMPERATURE [0.02]  GLOBAL_BATCH [256; demo 16]
#   MINI_BATCH [32]  NUM_HARD_NEG (per triplet; -1 = all) [1; causalneg -1]
#   WARMUP_RATIO [0.1; demo 0]  (linear warmup share of the steps; step 1 of a warmup trains with lr 0)
#   QEM_LAMBDA [0 for repair, 0.1 for causalneg]  QEM_TAU [0.1]  FULL_FINETUNE (1 = no LoRA) [0]
#   TRAIN_EXTRA     extra flags passed to training/10_train_lora.py []
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | grep '^#' | grep -v '^#SBATCH' | sed 's/^# \{0,1\}//'
  exit 0
fi
if [[ $# -gt 0 ]]; then echo "run_repair.sh takes no arguments (settings are environment variables; see --help)" >&2; exit 2; fi

# ------------------------------------------------------------------------------------------ settings
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
IS_DEMO=0
if [[ -z "${TRAIN_DATA:-}" ]]; then
  IS_DEMO=1
  DEMO=${DEMO:-full}
  case "$DEMO" in
    full) TRAIN_DATA="$HERE/data/demo/scifact-demo"; OUT_DIR=${OUT_DIR:-runs/demo}; DEMO_MINUTES=15 ;;
    tiny) TRAIN_DATA="$HERE/data/demo/scifact-tiny"; OUT_DIR=${OUT_DIR:-runs/demo-tiny}; DEMO_MINUTES=4 ;;
    *) echo "DEMO must be full or tiny, got '$DEMO'" >&2; exit 2 ;;
  esac
  MAX_LENGTH=${MAX_LENGTH:-128}
  EPOCHS=${EPOCHS:-1}
  LR=${LR:-1e-4}
  GLOBAL_BATCH=${GLOBAL_BATCH:-16}
  MINI_BATCH=${MINI_BATCH:-32}  # one mini-batch = the whole batch: GradCache skips its extra forward
  MAX_ROUNDS=${MAX_ROUNDS:-3}
  WARMUP_RATIO=${WARMUP_RATIO:-0}  # a demo trains a handful of steps: none of them may be spent at lr 0
  EVAL_DATA=${EVAL_DATA:-"$TRAIN_DATA"}
  ITERS=${ITERS:-$([[ "$DEMO" == tiny ]] && echo 1 || echo 2)}
fi
OUT_DIR=${OUT_DIR:-runs/repair}
ITERS=${ITERS:-2}
FORCE=${FORCE:-0}
DEVICE=${DEVICE:-}
NPROC=${NPROC:-1}
SEED=${SEED:-42}
MODEL=${MODEL:-smollm2-135m}
ADAPTER=${ADAPTER:-}
MAX_LENGTH=${MAX_LENGTH:-512}
BATCH_SIZE=${BATCH_SIZE:-32}
TRAIN_SPLIT=${TRAIN_SPLIT:-train}
EVAL_DATA=${EVAL_DATA:-}
EVAL_SPLIT=${EVAL_SPLIT:-test}
PCT=${PCT:-30}
DIA_TOP_K=${DIA_TOP_K:-50}
TOP_NEG_N=${TOP_NEG_N:-30}
EXTRACTOR=${EXTRACTOR:-regex}
NER_MODEL=${NER_MODEL:-yerim0210/MatDetector}
SOURCE=${SOURCE:-local}
LOCAL_CORPUS=${LOCAL_CORPUS:-}
S2_KEY_FILE=${S2_KEY_FILE:-}
ELSEVIER_KEY_FILE=${ELSEVIER_KEY_FILE:-}
GROUNDING=${GROUNDING:-none}
GENERATOR=${GENERATOR:-hf}
GEN_MODEL=${GEN_MODEL:-$MODEL}
GEN_ADAPTER=${GEN_ADAPTER:-auto}
OPENAI_URL=${OPENAI_URL:-${OPENAI_BASE_URL:-}}
TARGET_K=${TARGET_K:-20}
VALID_FACTOR=${VALID_FACTOR:-2}
GEN_ROUND=${GEN_ROUND:-}
MAX_ROUNDS=${MAX_ROUNDS:-6}
TOP_K=${TOP_K:-15}
CONSISTENCY_K=${CONSISTENCY_K:-5}
POOL=${POOL:-local}
NEGATIVES=${NEGATIVES:-repair}
CN_K=${CN_K:-3}
CN_RATIO=${CN_RATIO:-1.0}
CN_EXTRA=${CN_EXTRA:-}
EPOCHS=${EPOCHS:-2}
LR=${LR:-2e-5}
TEMPERATURE=${TEMPERATURE:-0.02}
GLOBAL_BATCH=${GLOBAL_BATCH:-256}
MINI_BATCH=${MINI_BATCH:-32}
if [[ -z "${NUM_HARD_NEG:-}" ]]; then  # causalneg trains on every negative of a line (15 mined + CN_K generated)
  if [[ "$NEGATIVES" == causalneg ]]; then NUM_HARD_NEG=-1; else NUM_HARD_NEG=1; fi
fi
QEM_TAU=${QEM_TAU:-0.1}
WARMUP_RATIO=${WARMUP_RATIO:-0.1}
FULL_FINETUNE=${FULL_FINETUNE:-0}
TRAIN_EXTRA=${TRAIN_EXTRA:-}
if [[ -z "${QEM_LAMBDA:-}" ]]; then
  if [[ "$NEGATIVES" == causalneg ]]; then QEM_LAMBDA=0.1; else QEM_LAMBDA=0; fi
fi
if [[ ! -e "$TRAIN_DATA" ]]; then echo "TRAIN_DATA not found: $TRAIN_DATA" >&2; exit 2; fi
case "$SOURCE" in local|semantic_scholar|elsevier) ;; *) echo "SOURCE must be local, semantic_scholar or elsevier" >&2; exit 2 ;; esac
case "$NEGATIVES" in repair|causalneg) ;; *) echo "NEGATIVES must be repair or causalneg" >&2; exit 2 ;; esac
if (( TOP_K < CONSISTENCY_K )); then
  echo "TOP_K ($TOP_K) must be >= CONSISTENCY_K ($CONSISTENCY_K): 09 decides rank(d+) <= kappa from 08's top-k list" >&2; exit 2
fi
case "$EXTRACTOR" in regex|matdetector) ;; *) echo "EXTRACTOR must be regex or matdetector" >&2; exit 2 ;; esac
if [[ "$GEN_ADAPTER" != auto && "$GEN_ADAPTER" != none && ! -f "$GEN_ADAPTER/adapter_config.json" ]]; then
  echo "GEN_ADAPTER must be auto, none or a LoRA adapter folder (no adapter_config.json in '$GEN_ADAPTER')" >&2; exit 2
fi
if [[ -z "$LOCAL_CORPUS" && "$SOURCE" == local ]]; then
  if [[ -d "$TRAIN_DATA" ]]; then LOCAL_CORPUS="$TRAIN_DATA"; else
    echo "SOURCE=local needs LOCAL_CORPUS (a BEIR folder or JSONL of papers)" >&2; exit 2; fi
fi
for spec in $EVAL_DATA; do
  path="${spec##*:}"
  if [[ ! -e "$path" ]]; then echo "EVAL_DATA entry not found: $path (from '$spec')" >&2; exit 2; fi
done

PP=$(printf '%02d' "$PCT")
mkdir -p "$OUT_DIR/logs" "$OUT_DIR/.state"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
LOGS="$OUT_DIR/logs"
STATE="$OUT_DIR/.state"
EMB_CACHE="$OUT_DIR/cache/embeddings"
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
DEVICE_FLAG=(); [[ -n "$DEVICE" ]] && DEVICE_FLAG=(--device "$DEVICE")

say() { printf '[repair %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# step NAME OUTPUT_PATH COMMAND...: skip when done (marker), else run with a log; stop the run on failure.
step() {
  local name=$1 output=$2; shift 2
  local marker="$STATE/$name.done" log="$LOGS/$name.log"
  if [[ -f "$marker" && "$FORCE" != 1 ]]; then say "skip  $name (done)"; return 0; fi
  if [[ "$FORCE" == 1 && -f "$marker" && -n "$output" ]]; then rm -rf "$output"; fi
  rm -f "$marker"
  printf '%q ' "$@" > "$LOGS/$name.cmd"; echo >> "$LOGS/$name.cmd"
  say "start $name  (log: $log)"
  local t0=$SECONDS
  if ! "$@" 2>&1 | tee -a "$log"; then
    say "FAILED step '$name'"
    say "  log:   $log"
    say "  rerun: $(cat "$LOGS/$name.cmd")"
    say "  (or rerun the driver: finished steps are skipped, this one resumes)"
    exit 1
  fi
  echo "$((SECONDS - t0))" > "$marker"
  say "done  $name in $((SECONDS - t0)) s"
}



T0_SIZE=$("$PYTHON" -c "import sys; sys.path.insert(0, '$HERE'); from repair.data import load_seed; print(len(load_seed('$TRAIN_DATA', split='$TRAIN_SPLIT')))")
TARGET_VALID=$((VALID_FACTOR * T0_SIZE))
GEN_ROUND=${GEN_ROUND:-$(( T0_SIZE > 16 ? T0_SIZE : 16 ))}

say "REPAIR run in $OUT_DIR: MODEL=$MODEL ITERS=$ITERS |T0|=$T0_SIZE PCT=$PCT SOURCE=$SOURCE NEGATIVES=$NEGATIVES"
if [[ $IS_DEMO == 1 ]]; then
  say "offline demo ($DEMO): SmolLM2-135M as retriever and generator, local-corpus verification on the shipped"
  say "SciFact slice. Expected duration on 2 CPU cores: about $DEMO_MINUTES minutes (faster on a GPU)."
fi

eval_step() {  # eval_step NAME OUT_JSON [--adapter DIR]
  local name=$1 out=$2; shift 2
  [[ -z "$EVAL_DATA" ]] && { say "skip  $name (EVAL_DATA empty)"; return 0; }
  # shellcheck disable=SC2086
  step "$name" "$out" "$PYTHON" "$HERE/eval/eval_suite.py" --model "$CUR_MODEL" "$@" --data $EVAL_DATA --split "$EVAL_SPLIT" \
    --max_length "$MAX_LENGTH" --batch_size "$BATCH_SIZE" --cache_dir "$EMB_CACHE" "${DEVICE_FLAG[@]}" --output "$out"
}

# ------------------------------------------------------------------------------------------ iteration 0: baseline eval
mkdir -p "$OUT_DIR/iter0/eval"
CUR_MODEL="$MODEL"  # full fine-tuning replaces the model folder each iteration; LoRA keeps MODEL + an adapter
BASE_ADAPTER_FLAG=(); [[ -n "$ADAPTER" ]] && BASE_ADAPTER_FLAG=(--adapter "$ADAPTER")
eval_step iter0.eval "$OUT_DIR/iter0/eval/eval.json" "${BASE_ADAPTER_FLAG[@]}"

CUR_ADAPTER="$ADAPTER"
TRIPLETS=()
for ((k = 1; k <= ITERS; k++)); do
  IT="$OUT_DIR/iter$k"
  DIA="$IT/diagnosis"; EXP="$IT/expansion"; DIF="$IT/differentiation"; ADP="$IT/adapter"; EV="$IT/eval"
  mkdir -p "$DIA" "$EXP" "$DIF" "$EV"
  AFLAG=(); [[ -n "$CUR_ADAPTER" ]] && AFLAG=(--adapter "$CUR_ADAPTER")
  say "=== iteration $k / $ITERS (retriever: $CUR_MODEL${CUR_ADAPTER:+ + $CUR_ADAPTER}) ==="

  # ---- Stage I: Diagnosis
  step "iter$k.01_margin" "" "$PYTHON" "$HERE/diagnosis/01_diagnosis_margin.py" --train_pt "$TRAIN_DATA" --split "$TRAIN_SPLIT" \
    --out_dir "$DIA" --model "$CUR_MODEL" "${AFLAG[@]}" --pct "$PCT" --top_k "$DIA_TOP_K" --max_length "$MAX_LENGTH" \
    --batch_size "$BATCH_SIZE" --cache_dir "$EMB_CACHE" "${DEVICE_FLAG[@]}"
  if [[ "$EXTRACTOR" == regex ]]; then
    step "iter$k.02_pathA" "$DIA/pathA_ccs_train" "$PYTHON" "$HERE/diagnosis/02_pathA_ccs_regex.py" --pct "$PCT" --dia_out_dir "$DIA" \
      --train_pt "$TRAIN_DATA" --split "$TRAIN_SPLIT" --out_dir "$DIA/pathA_ccs_train" --top_neg_n "$TOP_NEG_N"
  else
    step "iter$k.02_pathA" "$DIA/pathA_ccs_train" "$PYTHON" "$HERE/diagnosis/02_pathA_ccs_matdetector.py" --pct "$PCT" \
      --dia_out_dir "$DIA" --train_pt "$TRAIN_DATA" --split "$TRAIN_SPLIT" --out_dir "$DIA/pathA_ccs_train" \
      --top_neg_n "$TOP_NEG_N" --model "$NER_MODEL" "${DEVICE_FLAG[@]}"
  fi
  step "iter$k.03_pathB" "$DIA/pathB_finch_train" "$PYTHON" "$HERE/diagnosis/03_pathB_finch.py" --pct "$PCT" --dia_out_dir "$DIA" \
    --out_dir "$DIA/pathB_finch_train" --patha_out_dir "$DIA/pathA_ccs_train" "${DEVICE_FLAG[@]}"
  step "iter$k.04_merge" "$DIA/PathAB_terms" "$PYTHON" "$HERE/diagnosis/04_merge_cconf.py" --pct "$PCT" --dia_out_dir "$DIA" \
    --patha_out_dir "$DIA/pathA_ccs_train" --pathb_out_dir "$DIA/pathB_finch_train" --out_dir "$DIA/PathAB_terms"
  CONCEPTS="$DIA/PathAB_terms/final_terms.bottom_${PP}pct.txt"

  # ---- Stage II: Expansion (05 -> 06 until VALID_FACTOR x |T0| valid tuples or MAX_ROUNDS)
  # the generator (05 and CausalNeg's 10): the paper's default is the retriever's own backbone with its adapter
  GEN_BACKEND=(--backend "$GENERATOR")
  if [[ "$GENERATOR" == hf ]]; then
    GEN_BACKEND+=(--model "$GEN_MODEL")
    if [[ "$GEN_ADAPTER" == auto ]]; then
      # a contrastively trained adapter can wreck a small generator's text (docs/results.md, SmolLM2 iteration 2)
      [[ "$GEN_MODEL" == "$MODEL" && -n "$CUR_ADAPTER" ]] && GEN_BACKEND+=(--adapter "$CUR_ADAPTER")
    elif [[ "$GEN_ADAPTER" != none ]]; then
      GEN_BACKEND+=(--adapter "$GEN_ADAPTER")
    fi
  else
    [[ -n "$OPENAI_URL" ]] && GEN_BACKEND+=(--openai_url "$OPENAI_URL")
  fi
  GEN="$EXP/generated.bottom_${PP}pct.jsonl"
  EXPJ="$EXP/expansion.bottom_${PP}pct.jsonl"
  if [[ ! -f "$STATE/iter$k.expansion.done" || "$FORCE" == 1 ]]; then
    if [[ "$FORCE" == 1 && -f "$STATE/iter$k.expansion.done" ]]; then rm -f "$GEN"* "$EXPJ"*; fi
    for ((r = 1; r <= MAX_ROUNDS; r++)); do
      GEN_RESUME=(); [[ -f "$GEN" ]] && GEN_RESUME=(--resume)
      step "iter$k.05_generate.r$r" "" "$PYTHON" "$HERE/expansion/05_query_generation.py" --concept_txt "$CONCEPTS" \
        --out_jsonl "$GEN" --num_queries $((r * GEN_ROUND)) --seed "$SEED" --grounding "$GROUNDING" \
        "${GEN_BACKEND[@]}" "${GEN_RESUME[@]}" "${DEVICE_FLAG[@]}"
      VER_RESUME=(); [[ -f "$EXPJ" ]] && VER_RESUME=(--resume)
      case "$SOURCE" in
        local) SRC=("$PYTHON" "$HERE/expansion/06_local_corpus.py" --corpus "$LOCAL_CORPUS") ;;
        semantic_scholar) SRC=("$PYTHON" "$HERE/expansion/06_semantic_scholar.py"); [[ -n "$S2_KEY_FILE" ]] && SRC+=(--key_file "$S2_KEY_FILE") ;;
        elsevier) SRC=("$PYTHON" "$HERE/expansion/06_elsevier.py"); [[ -n "$ELSEVIER_KEY_FILE" ]] && SRC+=(--key_file "$ELSEVIER_KEY_FILE") ;;
      esac
      step "iter$k.06_verify.r$r" "" "${SRC[@]}" --generated_jsonl "$GEN" --out_jsonl "$EXPJ" --target_k "$TARGET_K" \
        --target_valid "$TARGET_VALID" "${VER_RESUME[@]}"
      VALID=$("$PYTHON" "$HERE/expansion/06_local_corpus.py" --out_jsonl "$EXPJ" --count_only | "$PYTHON" -c "import json,sys; print(json.load(sys.stdin)['valid'])")
      say "expansion round $r: $VALID / $TARGET_VALID valid tuples"
      [[ "$VALID" -ge "$TARGET_VALID" ]] && break
    done
    echo "$VALID" > "$STATE/iter$k.expansion.done"
  else
    say "skip  iter$k.expansion (done: $(cat "$STATE/iter$k.expansion.done") valid tuples)"
  fi

  # ---- Stage III: Differentiation
  step "iter$k.07_embed" "$DIF/embeddings" "$PYTHON" "$HERE/differentiation/07_embed_candidates.py" --input_jsonl "$EXPJ" \
    --output_dir "$DIF/embeddings" --num_gpus "$NPROC" --model "$CUR_MODEL" "${AFLAG[@]}" --max_length "$MAX_LENGTH" \
    --batch_size "$BATCH_SIZE" --cache_dir "$EMB_CACHE" "${DEVICE_FLAG[@]}"
  step "iter$k.08_hardneg" "" "$PYTHON" "$HERE/differentiation/08_hard_negative_selection.py" --input_jsonl "$EXPJ" \
    --embedding_dir "$DIF/embeddings" --output_jsonl "$DIF/hard_negatives.bottom_${PP}pct.jsonl" --top_k "$TOP_K"
  FINAL="$DIF/final_train_data.bottom_${PP}pct.jsonl"
  step "iter$k.09_consistency" "" "$PYTHON" "$HERE/differentiation/09_consistency_filter.py" \
    --input_jsonl "$DIF/hard_negatives.bottom_${PP}pct.jsonl" --embedding_dir "$DIF/embeddings" --output_jsonl "$FINAL" \
    --top_k "$TOP_K" --consistency_k "$CONSISTENCY_K" --pool "$POOL" --stats_json "$DIF/consistency_stats.json"
  if [[ "$NEGATIVES" == causalneg ]]; then
    CN="$DIF/final_train_data.causalneg.bottom_${PP}pct.jsonl"
    CN_RESUME=(); [[ -f "$CN" ]] && CN_RESUME=(--resume)
    # shellcheck disable=SC2086
    step "iter$k.09b_counterfactual" "" "$PYTHON" "$HERE/differentiation/09b_counterfactual_negatives.py" --input_jsonl "$FINAL" \
      --output_jsonl "$CN" --k "$CN_K" --ratio "$CN_RATIO" --corpus "${LOCAL_CORPUS:-$TRAIN_DATA}" "${GEN_BACKEND[@]}" \
      --seed "$SEED" "${CN_RESUME[@]}" "${DEVICE_FLAG[@]}" $CN_EXTRA
    FINAL="$CN"
  fi
  TRIPLETS+=(--triplets "$FINAL")

  # ---- Training: T0 + every iteration's triplets so far, starting from the previous adapter
  # any earlier attempt (with or without a checkpoint: --save_steps 0 writes none) is resumed; without a
  # checkpoint the trainer restarts from step 0 and drops the killed run's log lines
  TRAIN_RESUME=(); [[ -d "$ADP" ]] && TRAIN_RESUME=(--resume)
  INIT=(); [[ -n "$CUR_ADAPTER" ]] && INIT=(--init_adapter "$CUR_ADAPTER")
  FT=(); [[ "$FULL_FINETUNE" == 1 ]] && FT=(--full_finetune)
  LAUNCH=("$PYTHON"); [[ "$NPROC" -gt 1 ]] && LAUNCH=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC")
  # shellcheck disable=SC2086
  step "iter$k.10_train" "" "${LAUNCH[@]}" "$HERE/training/10_train_lora.py" --model "$CUR_MODEL" "${INIT[@]}" "${FT[@]}" \
    --train_data "$TRAIN_DATA" --split "$TRAIN_SPLIT" "${TRIPLETS[@]}" --num_hard_negatives "$NUM_HARD_NEG" \
    --output_dir "$ADP" --epochs "$EPOCHS" --lr "$LR" --temperature "$TEMPERATURE" --global_batch_size "$GLOBAL_BATCH" \
    --mini_batch_size "$MINI_BATCH" --max_length "$MAX_LENGTH" --qem_lambda "$QEM_LAMBDA" --qem_tau "$QEM_TAU" --warmup_ratio "$WARMUP_RATIO" \
    --seed "$SEED" "${TRAIN_RESUME[@]}" "${DEVICE_FLAG[@]}" $TRAIN_EXTRA
  if [[ "$FULL_FINETUNE" == 1 ]]; then CUR_MODEL="$ADP"; CUR_ADAPTER=""; else CUR_ADAPTER="$ADP"; fi
  AFLAG=(); [[ -n "$CUR_ADAPTER" ]] && AFLAG=(--adapter "$CUR_ADAPTER")

  # ---- Evaluation after this iteration
  eval_step "iter$k.eval" "$EV/eval.json" "${AFLAG[@]}"
done

# ------------------------------------------------------------------------------------------ report
step report "" "$PYTHON" "$HERE/eval/run_report.py" --run_dir "$OUT_DIR" --pct "$PCT"
rm -f "$STATE/report.done"  # the report is cheap: always rebuilt so it reflects the latest state
say "report: $OUT_DIR/report.md"
