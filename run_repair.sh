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
#   bash run_repair.sh                    # offline demo (PROFILE=demo: SmolLM2-135M, shipped SciFact slice), ~15 min on 2 CPU cores
#   PROFILE=demo-tiny bash run_repair.sh  # smaller demo, ~4 min (DEMO=tiny is the same)
#   sbatch run_repair.sh                  # on a Slurm node (the #SBATCH lines above; edit or override them)
#   sbatch --nodes=2 --gres=gpu:4 --export=ALL,NPROC=4 run_repair.sh
#                                         # 2 nodes x 4 GPUs (issue 42): the driver and the one-process steps (01-06,
#                                         # 08, 09, 09b, eval) run on the first node; 10's training and 07's encoding
#                                         # run on all 8 GPUs: srun starts one torchrun per node, meeting at the first
#                                         # node (NNODES = $SLURM_NNODES; OUT_DIR on a filesystem both nodes share)
#   MODEL=Qwen/Qwen2.5-0.5B TRAIN_DATA=seed.pt EVAL_DATA="nfcorpus:ir:/data/nfcorpus" OUT_DIR=runs/q05 bash run_repair.sh
#   bash run_repair.sh --help             # this text and every setting with its default
#
# Every setting is an environment variable; the list below (from repair/driver/settings.py, where the defaults and
# the rules live) gives each one's default and each profile's value. Settings are checked before any work
# (a bad value stops the run in a second, naming the setting), and recorded in $OUT_DIR/settings.json.
# A rerun skips finished steps and resumes unfinished ones (05/06 and training resume where they stopped);
# it refuses settings that differ from the recorded ones (naming each; a new OUT_DIR or FORCE=1 proceeds).
# FORCE=1 first removes every marker and step output of OUT_DIR (logs and caches stay), then redoes everything.
# Layout: $OUT_DIR/iter{k}/{diagnosis,expansion,differentiation,adapter,eval}, logs in $OUT_DIR/logs, the report
# in $OUT_DIR/report.md.
# To run one stage by hand exactly as the driver did, copy its command from $OUT_DIR/logs/<step>.cmd: the
# scripts' own defaults (e.g. --max_length 512) are not the demo profile's (configs/demo.env: 128).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# ------------------------------------------------------------------------------------------ settings
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
# the steps import the repair package: installed by install.sh (pip install -e .); this checkout's copy also
# wins for any other PYTHON the driver is given
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
settings_py() { PYTHON="$PYTHON" "$PYTHON" -m repair.driver.settings "$@" --root "$HERE"; }
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | grep '^#' | grep -v '^#SBATCH' | sed 's/^# \{0,1\}//'
  echo
  settings_py help
  exit 0
fi
if [[ $# -gt 0 ]]; then echo "run_repair.sh takes no arguments (settings are environment variables; see --help)" >&2; exit 2; fi
if [[ -n "${DEMO:-}" && -n "${TRAIN_DATA:-}" && -z "${PROFILE:-}" ]]; then
  echo "note: DEMO=$DEMO is ignored because TRAIN_DATA is set (PROFILE=demo-tiny applies that profile to your data)" >&2
fi
# validate every setting (types, ranges, enums, paths), compare with $OUT_DIR/settings.json, then take them
SETTINGS_SH=$(settings_py resolve) || exit $?
eval "$SETTINGS_SH"

# the launch line of the rank-parallel steps (10, 07): one process, torchrun on this node, or torchrun on NNODES
# nodes (srun inside Slurm); built and checked by repair/driver/launch.py (issue 42)
LAUNCH_SH=$(NNODES="$NNODES" NPROC="$NPROC" NODE_RANK="$NODE_RANK" MASTER_ADDR="$MASTER_ADDR" MASTER_PORT="$MASTER_PORT" \
  "$PYTHON" -m repair.driver.launch shell --python "$PYTHON") || exit 2
eval "$LAUNCH_SH"
if [[ "$NODE_RANK" != 0 ]]; then
  echo "run_repair.sh runs on node 0 only (NODE_RANK=$NODE_RANK): on the other nodes start each rank-parallel step's" \
    "\$OUT_DIR/logs/<step>.peer.cmd, which node 0's driver writes and names" >&2
  exit 2
fi

PP=$(printf '%02d' "$PCT")
mkdir -p "$OUT_DIR/logs" "$OUT_DIR/.state"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
LOGS="$OUT_DIR/logs"
STATE="$OUT_DIR/.state"
EMB_CACHE="$OUT_DIR/cache/embeddings"
# FORCE=1 (issue 44): start the run folder over before any step, so nothing of a run with other settings is resumed
# or skipped, now or by a plain rerun after this run is killed (repair/driver/steps.py: clear_run)
if [[ "$FORCE" == 1 ]]; then "$PYTHON" -m repair.driver.steps clear "$OUT_DIR"; fi
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# peft's PeftModel() reads transformers' deprecated is_gradient_checkpointing on every adapter load: one
# FutureWarning per load (9 in a demo) that says nothing about the run
export PYTHONWARNINGS="ignore:\`is_gradient_checkpointing\` is deprecated:FutureWarning${PYTHONWARNINGS:+,$PYTHONWARNINGS}"
DEVICE_FLAG=(); [[ -n "$DEVICE" ]] && DEVICE_FLAG=(--device "$DEVICE")

say() { printf '[repair %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# step NAME OUTPUT_PATH COMMAND...: skip when done (marker), else run with a log; stop the run on failure.
# The log gets every line; the console gets them too, except a stage's one-line JSON summary, which is
# shown as a short "summary:" line (its full text stays in the log). OUTPUT_PATH names the step's main output for
# the reader; FORCE=1 has removed every output before the first step (clear_run above).
# A finished step also lists the files it wrote in $STATE/NAME.outputs (repair/driver/steps.py: the files changed
# since its first start), so a run's steps can be reused file by file.
STEPS_RUN=0
step() {
  local name=$1; shift 2  # $2: OUTPUT_PATH (see above)
  local marker="$STATE/$name.done" log="$LOGS/$name.log"
  if [[ -f "$marker" && "$FORCE" != 1 ]]; then say "skip  $name (done)"; return 0; fi
  rm -f "$marker"
  local fresh=(); [[ "$FORCE" == 1 ]] && fresh=(--fresh)
  "$PYTHON" -m repair.driver.steps begin "$STATE" "$name" "${fresh[@]}"
  printf '%q ' "$@" > "$LOGS/$name.cmd"; echo >> "$LOGS/$name.cmd"
  say "start $name  (log: $log)"
  STEPS_RUN=$((STEPS_RUN + 1))
  local t0=$SECONDS
  if ! "$@" 2>&1 | tee -a "$log" | "$PYTHON" "$HERE/eval/run_report.py" --console "$name"; then
    say "FAILED step '$name'"
    say "  log:   $log"
    say "  rerun: $(cat "$LOGS/$name.cmd")"
    say "  (or rerun the driver: finished steps are skipped, this one resumes)"
    exit 1
  fi
  "$PYTHON" -m repair.driver.steps record "$STATE" "$name"  # before the marker: a done step has its record
  echo "$((SECONDS - t0))" > "$marker"
  say "done  $name in $((SECONDS - t0)) s"
}



# T0_SIZE, T0_STEPS and TARGET_VALID (= VALID_FACTOR x |T0|) come from the settings check, computed and bounded in
# Python (bash's arithmetic wraps around silently; issue 44)
GEN_ROUND=${GEN_ROUND:-$(( T0_SIZE > 16 ? T0_SIZE : 16 ))}

say "REPAIR run in $OUT_DIR: MODEL=$MODEL ITERS=$ITERS |T0|=$T0_SIZE PCT=$PCT SOURCE=$SOURCE NEGATIVES=$NEGATIVES"
if [[ "$GENERATOR" == hf ]]; then GEN_TEXT="$GEN_MODEL ($GEN_BACKEND, GEN_ADAPTER=$GEN_ADAPTER)"; else GEN_TEXT="openai server ${OPENAI_URL:-\$OPENAI_BASE_URL}"; fi
say "retriever: $MODEL${ADAPTER:+ + $ADAPTER}; generator: $GEN_TEXT; T0: $TRAIN_DATA [$TRAIN_SPLIT]"
say "training and 07: $LAUNCH_TEXT"
if [[ -n "$PROFILE_NAME" ]]; then
  say "profile $PROFILE_NAME ($PROFILE_FILE): $PROFILE_ABOUT"
fi

eval_step() {  # eval_step NAME OUT_JSON [--adapter DIR]
  local name=$1 out=$2; shift 2
  [[ -z "$EVAL_DATA" ]] && { say "skip  $name (EVAL_DATA empty)"; return 0; }
  # shellcheck disable=SC2086
  step "$name" "$out" "$PYTHON" "$HERE/eval/eval_suite.py" --model "$CUR_MODEL" "$@" --data $EVAL_DATA --split "$EVAL_SPLIT" \
    --max_length "$MAX_LENGTH" --batch_size "$BATCH_SIZE" --cache_dir "$EMB_CACHE" "${DEVICE_FLAG[@]}" --output "$out"
}

# dist_step NAME OUTPUT_PATH SCRIPT ARGS...: a rank-parallel step (10, 07) as step() runs it, under LAUNCH. Several
# nodes outside Slurm: the other nodes' line goes to $LOGS/NAME.peer.cmd, to start there by hand (the step waits in
# torchrun's rendezvous until every node has joined)
dist_step() {
  local name=$1 output=$2; shift 2
  if [[ ${#LAUNCH_PEER[@]} -gt 0 && ( "$FORCE" == 1 || ! -f "$STATE/$name.done" ) ]]; then
    { printf 'cd %q && PYTHONPATH=%q TOKENIZERS_PARALLELISM=false ' "$HERE" "$PYTHONPATH"
      printf '%q ' "${LAUNCH_PEER[@]}" "$@"; echo; } > "$LOGS/$name.peer.cmd"
    say "note  $name needs the other $((NNODES - 1)) node(s): on each, run  bash $LOGS/$name.peer.cmd"
  fi
  step "$name" "$output" "${LAUNCH[@]}" "$@"
}

# ------------------------------------------------------------------------------------------ training (one command)
FT=(); [[ "$FULL_FINETUNE" == 1 ]] && FT=(--full_finetune)
# ITER_STEPS=t0: every training takes the steps plain fine-tuning on T0 takes (T0_STEPS, computed with the settings:
# EPOCHS x ceil(|T0| / GLOBAL_BATCH)); the trainer then stops at --max_steps whatever the triplets add (issue 16's
# equal-steps budget)
STEPS_FLAG=(); [[ "$ITER_STEPS" == t0 ]] && STEPS_FLAG=(--max_steps "$T0_STEPS")
# SCHEDULE=one: the trainings (warm start, iterations) are consecutive T0_STEPS slices of one schedule; slice j ends
# at step j x T0_STEPS and goes on from the previous training's weights, optimizer, LR and step (--continue_from)
TRAININGS=$((ITERS + WARM_START)); PREV_TRAINING=""
# train_step NAME OUTPUT_DIR SLICE DATA_FLAGS...: fine-tune the current retriever (CUR_MODEL, starting from
# CUR_ADAPTER; with SCHEDULE=one, slice SLICE of the schedule, continuing PREV_TRAINING) on DATA_FLAGS, then make the
# result the current retriever (full fine-tuning: a model folder; LoRA: an adapter) and PREV_TRAINING.
# Any earlier attempt (with or without a checkpoint: --save_steps 0 writes none) is resumed; without a checkpoint
# the trainer restarts from step 0 and drops the killed run's log lines.
train_step() {
  local name=$1 out=$2 slice=$3; shift 3
  local resume=(); [[ -d "$out" ]] && resume=(--resume)
  local init=(); [[ -n "$CUR_ADAPTER" ]] && init=(--init_adapter "$CUR_ADAPTER")
  local steps=("${STEPS_FLAG[@]}")
  if [[ "$SCHEDULE" == one ]]; then
    steps=(--max_steps "$((TRAININGS * T0_STEPS))" --last_step "$((slice * T0_STEPS))")
    [[ -n "$PREV_TRAINING" ]] && steps+=(--continue_from "$PREV_TRAINING")
  fi
  # shellcheck disable=SC2086
  dist_step "$name" "" "$HERE/training/10_train_lora.py" --model "$CUR_MODEL" "${init[@]}" "${FT[@]}" \
    "$@" --num_hard_negatives "$NUM_HARD_NEG" \
    --output_dir "$out" --epochs "$EPOCHS" --lr "$LR" --temperature "$TEMPERATURE" --global_batch_size "$GLOBAL_BATCH" \
    --mini_batch_size "$MINI_BATCH" --max_length "$MAX_LENGTH" --qem_lambda "$QEM_LAMBDA" --qem_tau "$QEM_TAU" --warmup_ratio "$WARMUP_RATIO" \
    --seed "$SEED" "${resume[@]}" "${DEVICE_FLAG[@]}" "${steps[@]}" $TRAIN_EXTRA
  if [[ "$FULL_FINETUNE" == 1 ]]; then CUR_MODEL="$out"; CUR_ADAPTER=""; else CUR_ADAPTER="$out"; fi
  PREV_TRAINING="$out"
}

CUR_MODEL="$MODEL"  # full fine-tuning replaces the model folder each iteration; LoRA keeps MODEL + an adapter
CUR_ADAPTER="$ADAPTER"
TRIPLETS=()
# ---- T0_NEGATIVES=bm25: T0's own queries train with BM25-mined corpus negatives (issue 16's strongest plain
# baseline) instead of in-batch negatives only; mined once per run (T0 and the corpus do not change between iterations)
T0_FLAGS=(--train_data "$TRAIN_DATA" --split "$TRAIN_SPLIT")
if [[ "$T0_NEGATIVES" == bm25 ]]; then
  mkdir -p "$OUT_DIR/t0_negatives"
  T0_BM25="$OUT_DIR/t0_negatives/t0_bm25.jsonl"
  T0_RESUME=(); [[ -f "$T0_BM25" ]] && T0_RESUME=(--resume)
  step "t0.bm25_negatives" "" "$PYTHON" "$HERE/differentiation/09b_counterfactual_negatives.py" --config mined \
    --input "$TRAIN_DATA" --split "$TRAIN_SPLIT" --corpus "${LOCAL_CORPUS:-$TRAIN_DATA}" --output_jsonl "$T0_BM25" \
    "${T0_RESUME[@]}"
  T0_FLAGS=(--triplets "$T0_BM25")
fi
# ---- WARM_START=1: plain fine-tuning on T0 alone first (issue 16's lever 4): REPAIR then diagnoses a model that
# already knows T0, so Q_conf holds what plain fine-tuning leaves confused (docs/results.md, repair_conf_bm25_from_bm25)
mkdir -p "$OUT_DIR/iter0/eval"
if [[ "$WARM_START" == 1 ]]; then
  # iteration 0 is then the warm-started model: the model the run starts from (MODEL, + ADAPTER) is evaluated first,
  # so the report shows it as its own row
  mkdir -p "$OUT_DIR/iter0/eval_offshelf"
  AFLAG=(); [[ -n "$CUR_ADAPTER" ]] && AFLAG=(--adapter "$CUR_ADAPTER")
  eval_step iter0.eval_offshelf "$OUT_DIR/iter0/eval_offshelf/eval.json" "${AFLAG[@]}"
  train_step iter0.10_warm_start "$OUT_DIR/iter0/adapter" 1 "${T0_FLAGS[@]}"
fi
# CONTROL=1: a second chain of trainings, each the same as REPAIR's (same start, steps, schedule slice, seed) on T0's
# data alone, evaluated beside it: the plain equal-steps control, so a run measures its own gain
CONTROL_STATE=("$CUR_MODEL" "$CUR_ADAPTER" "$PREV_TRAINING")

# ------------------------------------------------------------------------------------------ iteration 0: the starting model's eval
AFLAG=(); [[ -n "$CUR_ADAPTER" ]] && AFLAG=(--adapter "$CUR_ADAPTER")
eval_step iter0.eval "$OUT_DIR/iter0/eval/eval.json" "${AFLAG[@]}"

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

  # ---- Stage II: Expansion (05 -> 06 rounds until VALID_FACTOR x |T0| valid tuples or MAX_ROUNDS: expansion/05_06_rounds.py
  # runs each 05 and 06 as a step like the ones here, and writes $STATE/iter$k.expansion.done with the valid count)
  # the generator (05, 06c and CausalNeg's 09b): the paper's default is the retriever's own backbone with its adapter
  GEN_FLAGS=(--backend "$GENERATOR")
  if [[ "$GENERATOR" == hf ]]; then
    GEN_FLAGS+=(--gen_backend "$GEN_BACKEND" --model "$GEN_MODEL")
    if [[ "$GEN_ADAPTER" == auto ]]; then
      # a contrastively trained adapter can wreck a small generator's text (docs/results.md, SmolLM2 iteration 2)
      [[ "$GEN_MODEL" == "$MODEL" && -n "$CUR_ADAPTER" ]] && GEN_FLAGS+=(--adapter "$CUR_ADAPTER")
    elif [[ "$GEN_ADAPTER" != none ]]; then
      GEN_FLAGS+=(--adapter "$GEN_ADAPTER")
    fi
  else
    [[ -n "$OPENAI_URL" ]] && GEN_FLAGS+=(--openai_url "$OPENAI_URL")
    [[ -n "$OPENAI_EXTRA" ]] && GEN_FLAGS+=(--openai_no_repetition_penalty --openai_extra "$OPENAI_EXTRA")
  fi
  EXPJ="$EXP/expansion.bottom_${PP}pct.jsonl"
  # JUDGE=1 (issue 30): 06d judges every round's tuples (expansion/06d_judge_relevance.py); Stage III reads its file.
  # The judge is JUDGE_MODEL in process (no adapter), or the generator's own server with GENERATOR=openai.
  JUDGE_FLAGS=(--judge "$JUDGE")
  if [[ "$JUDGE" == 1 ]]; then
    if [[ "$GENERATOR" == hf ]]; then JUDGE_BACKEND=(--backend hf --model "$JUDGE_MODEL"); else JUDGE_BACKEND=("${GEN_FLAGS[@]}"); fi
    JUDGE_BACKEND+=(--threshold "$JUDGE_THRESHOLD" --judge_k "$JUDGE_K" --cache_jsonl "$OUT_DIR/cache/judge.jsonl")
    JUDGE_FLAGS+=(--judged_jsonl "$EXP/expansion.judged.bottom_${PP}pct.jsonl" --judge_args "$(printf '%q ' "${JUDGE_BACKEND[@]}")")
  fi
  # QUERY_FORM=doc2query (issue 30): no concept search; 06c writes queries from Stage I's confusing documents below
  D2Q=0; [[ "$QUERY_FORM" == doc2query && "$EXPANSION" == 1 ]] && D2Q=1
  # HARD_TUPLES=1 (issue 43): 06e keeps the verified tuples the current retriever gets wrong (differentiation/
  # 06e_hard_tuples.py), in each 05 -> 06 round (title / generated forms: HARD_TARGET counts them) or after 06c
  HARD_ARGS=(--model "$CUR_MODEL" "${AFLAG[@]}" --max_length "$MAX_LENGTH" --batch_size "$BATCH_SIZE" \
    --cache_dir "$EMB_CACHE" --margin "$HARD_MARGIN" --budget "$HARD_BUDGET" --dup_cosine "$HARD_DUP" \
    --lex_tie "$HARD_LEX_TIE" "${DEVICE_FLAG[@]}")
  HARD_ROUNDS=(); HARD_AFTER=0
  if [[ "$HARD_TUPLES" == 1 && ( "$QUERY_FORM" == t0 || "$D2Q" == 1 ) ]]; then HARD_AFTER=1
  elif [[ "$HARD_TUPLES" == 1 ]]; then
    HARD_ROUNDS=(--hard_jsonl "$EXP/expansion.hard.bottom_${PP}pct.jsonl" --hard_args "$(printf '%q ' "${HARD_ARGS[@]}")"
      --hard_target "$HARD_TARGET")
  fi
  [[ "$EXPANSION" == 1 && "$D2Q" == 0 && ( "$FORCE" == 1 || ! -f "$STATE/iter$k.expansion.done" ) ]] && STEPS_RUN=$((STEPS_RUN + 1))
  [[ "$D2Q" == 0 ]] && "$PYTHON" "$HERE/expansion/05_06_rounds.py" --iteration "iter$k" --state_dir "$STATE" --logs_dir "$LOGS" \
    --expansion "$EXPANSION" --force "$FORCE" --concept_txt "$CONCEPTS" --generated_jsonl "$EXP/generated.bottom_${PP}pct.jsonl" \
    --out_jsonl "$EXPJ" --gen_round "$GEN_ROUND" --max_rounds "$MAX_ROUNDS" --target_valid "$TARGET_VALID" \
    --target_k "$TARGET_K" --seed "$GEN_SEED" --grounding "$GROUNDING" --query_form "$QUERY_FORM" --source "$SOURCE" \
    --local_corpus "$LOCAL_CORPUS" --literature_index "$LITERATURE_INDEX" --s2_key_file "$S2_KEY_FILE" --elsevier_key_file "$ELSEVIER_KEY_FILE" \
    --device "$DEVICE" --python "$PYTHON" "${JUDGE_FLAGS[@]}" "${HARD_ROUNDS[@]}" -- "${GEN_FLAGS[@]}"
  [[ "$JUDGE" == 1 ]] && EXPJ="$EXP/expansion.judged.bottom_${PP}pct.jsonl"
  [[ ${#HARD_ROUNDS[@]} -gt 0 ]] && EXPJ="$EXP/expansion.hard.bottom_${PP}pct.jsonl"

  if [[ "$QUERY_FORM" == t0 && "$EXPANSION" == 1 ]]; then  # issue 16: q_new rewritten in T0's query style
    EXPT0="$EXP/expansion.t0.bottom_${PP}pct.jsonl"
    T0_RESUME=(); [[ -f "$EXPT0" ]] && T0_RESUME=(--resume)
    step "iter$k.06c_t0_style" "" "$PYTHON" "$HERE/expansion/06c_t0_style_queries.py" --input_jsonl "$EXPJ" \
      --train_data "$TRAIN_DATA" --split "$TRAIN_SPLIT" --out_jsonl "$EXPT0" --seed "$GEN_SEED" --style "$QUERY_STYLE" \
      "${GEN_FLAGS[@]}" "${T0_RESUME[@]}" "${DEVICE_FLAG[@]}" $QUERY_EXTRA
    EXPJ="$EXPT0"
  fi
  # Q_conf's own queries with D-(q) (06b): Stage III's input with CONFUSED_TUPLES=1, doc2query's documents with D2Q=1
  CONFJ="$DIF/confused_tuples.bottom_${PP}pct.jsonl"
  if [[ "$CONFUSED_TUPLES" == 1 || "$D2Q" == 1 ]]; then
    step "iter$k.06b_confused" "" "$PYTHON" "$HERE/differentiation/06b_confused_tuples.py" --dia_out_dir "$DIA" \
      --pct "$PCT" --train_pt "$TRAIN_DATA" --split "$TRAIN_SPLIT" --top_neg_n "$TARGET_K" --output_jsonl "$CONFJ"
  fi
  if [[ "$D2Q" == 1 ]]; then
    EXPJ="$EXP/expansion.doc2query.bottom_${PP}pct.jsonl"
    D2Q_RESUME=(); [[ -f "$EXPJ" ]] && D2Q_RESUME=(--resume)
    step "iter$k.06c_doc2query" "" "$PYTHON" "$HERE/expansion/06c_t0_style_queries.py" --input_jsonl "$CONFJ" \
      --doc2query "$D2Q_DOCS" --train_data "$TRAIN_DATA" --split "$TRAIN_SPLIT" --out_jsonl "$EXPJ" --seed "$GEN_SEED" \
      --style "$QUERY_STYLE" "${GEN_FLAGS[@]}" "${D2Q_RESUME[@]}" "${DEVICE_FLAG[@]}" $QUERY_EXTRA
  fi

  if [[ "$HARD_AFTER" == 1 ]]; then  # HARD_TUPLES=1 on 06c's rewritten (t0) or written (doc2query) queries
    step "iter$k.06e_hard" "" "$PYTHON" "$HERE/differentiation/06e_hard_tuples.py" --input_jsonl "$EXPJ" \
      --output_jsonl "$EXP/expansion.hard.bottom_${PP}pct.jsonl" "${HARD_ARGS[@]}"
    EXPJ="$EXP/expansion.hard.bottom_${PP}pct.jsonl"
  fi

  # ---- Stage III: Differentiation (input: Stage II's tuples and, with CONFUSED_TUPLES=1, Q_conf's own queries)
  S3_IN=(); [[ "$EXPANSION" == 1 ]] && S3_IN=("$EXPJ")
  [[ "$CONFUSED_TUPLES" == 1 ]] && S3_IN+=("$CONFJ")
  FN_FLAGS=(); [[ -n "$FN_PCT" ]] && FN_FLAGS+=(--fn_pct "$FN_PCT"); [[ -n "$FN_MARGIN" ]] && FN_FLAGS+=(--fn_margin "$FN_MARGIN")
  # one node: 07 spawns its NPROC workers itself; several: torchrun's ranks on every node (rank 0 writes the dir)
  EMBED=(step "iter$k.07_embed" "$DIF/embeddings" "$PYTHON"); [[ "$NNODES" -gt 1 ]] && EMBED=(dist_step "iter$k.07_embed" "$DIF/embeddings")
  "${EMBED[@]}" "$HERE/differentiation/07_embed_candidates.py" --input_jsonl "${S3_IN[@]}" \
    --output_dir "$DIF/embeddings" --num_gpus "$NPROC" --model "$CUR_MODEL" "${AFLAG[@]}" --max_length "$MAX_LENGTH" \
    --batch_size "$BATCH_SIZE" --cache_dir "$EMB_CACHE" "${DEVICE_FLAG[@]}"
  step "iter$k.08_hardneg" "" "$PYTHON" "$HERE/differentiation/08_hard_negative_selection.py" --input_jsonl "${S3_IN[@]}" \
    --embedding_dir "$DIF/embeddings" --output_jsonl "$DIF/hard_negatives.bottom_${PP}pct.jsonl" --top_k "$TOP_K" \
    "${FN_FLAGS[@]}"
  FINAL="$DIF/final_train_data.bottom_${PP}pct.jsonl"
  step "iter$k.09_consistency" "" "$PYTHON" "$HERE/differentiation/09_consistency_filter.py" \
    --input_jsonl "$DIF/hard_negatives.bottom_${PP}pct.jsonl" --embedding_dir "$DIF/embeddings" --output_jsonl "$FINAL" \
    --top_k "$TOP_K" --consistency_k "$CONSISTENCY_K" --pool "$POOL" --stats_json "$DIF/consistency_stats.json"
  if [[ "$NEGATIVES" == causalneg && ! -s "$FINAL" ]]; then
    say "skip  iter$k.09b_counterfactual (09 kept no tuple: $FINAL is empty)"  # 09b refuses an empty input
  elif [[ "$NEGATIVES" == causalneg ]]; then
    CN="$DIF/final_train_data.causalneg.bottom_${PP}pct.jsonl"
    CN_RESUME=(); [[ -f "$CN" ]] && CN_RESUME=(--resume)
    # shellcheck disable=SC2086
    step "iter$k.09b_counterfactual" "" "$PYTHON" "$HERE/differentiation/09b_counterfactual_negatives.py" --input_jsonl "$FINAL" \
      --output_jsonl "$CN" --k "$CN_K" --ratio "$CN_RATIO" --corpus "${LOCAL_CORPUS:-$TRAIN_DATA}" "${GEN_FLAGS[@]}" \
      --seed "$GEN_SEED" "${CN_RESUME[@]}" "${DEVICE_FLAG[@]}" $CN_EXTRA
    FINAL="$CN"
  fi
  TRIPLETS+=(--triplets "$FINAL")

  # ---- Training: T0 + every iteration's triplets so far, starting from the previous adapter
  train_step "iter$k.10_train" "$ADP" "$((k + WARM_START))" "${T0_FLAGS[@]}" "${TRIPLETS[@]}"
  AFLAG=(); [[ -n "$CUR_ADAPTER" ]] && AFLAG=(--adapter "$CUR_ADAPTER")

  # ---- Evaluation after this iteration
  eval_step "iter$k.eval" "$EV/eval.json" "${AFLAG[@]}"

  # ---- CONTROL=1: the same training on T0's data alone, from the previous control (iteration 1: the same start)
  if [[ "$CONTROL" == 1 ]]; then
    REPAIR_STATE=("$CUR_MODEL" "$CUR_ADAPTER" "$PREV_TRAINING")
    CUR_MODEL=${CONTROL_STATE[0]}; CUR_ADAPTER=${CONTROL_STATE[1]}; PREV_TRAINING=${CONTROL_STATE[2]}
    train_step "iter$k.10_control" "$IT/control" "$((k + WARM_START))" "${T0_FLAGS[@]}"
    CAFLAG=(); [[ -n "$CUR_ADAPTER" ]] && CAFLAG=(--adapter "$CUR_ADAPTER")
    mkdir -p "$IT/eval_control"
    eval_step "iter$k.eval_control" "$IT/eval_control/eval.json" "${CAFLAG[@]}"
    CONTROL_STATE=("$CUR_MODEL" "$CUR_ADAPTER" "$PREV_TRAINING")
    CUR_MODEL=${REPAIR_STATE[0]}; CUR_ADAPTER=${REPAIR_STATE[1]}; PREV_TRAINING=${REPAIR_STATE[2]}
  fi
done

# ------------------------------------------------------------------------------------------ report
# rebuilt after any step ran (so it reflects the latest state); a rerun that did nothing keeps the report as is
if [[ "$STEPS_RUN" -gt 0 || ! -f "$OUT_DIR/report.md" ]]; then
  REPORT_FORCE=(); [[ "$FORCE" == 1 ]] && REPORT_FORCE=(--force)
  if ! "$PYTHON" "$HERE/eval/run_report.py" --run_dir "$OUT_DIR" --pct "$PCT" "${REPORT_FORCE[@]}" 2>&1 | tee -a "$LOGS/report.log"; then
    say "FAILED: the report (log: $LOGS/report.log)"; exit 1
  fi
else
  say "nothing to do: every step was already done; the report is unchanged"
  "$PYTHON" "$HERE/eval/run_report.py" --run_dir "$OUT_DIR" --print_only
fi
say "report: $OUT_DIR/report.md"
FINAL_RETRIEVER="$CUR_ADAPTER"; [[ "$FULL_FINETUNE" == 1 ]] && FINAL_RETRIEVER="$CUR_MODEL"
if [[ -d "$FINAL_RETRIEVER" ]]; then say "$("$PYTHON" "$HERE/eval/run_report.py" --final_retriever "$FINAL_RETRIEVER")"; fi
