"""The table of every ``run_repair.sh`` setting: name, group, default, check, help, and whether it changes results.

Apart from :mod:`repair.driver.settings` (which resolves and validates them; :mod:`repair.driver.run_record` records
them) so that adding a setting is one entry here, read top to bottom like the driver's ``--help``, which is generated
from it. MODEL and the Training defaults are not restated: they come from :data:`repair.models.DEFAULT_MODEL` and
:class:`repair.training.config.TrainConfig`. :class:`SettingsError` (the one error of bad settings) lives here, below
both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repair.cli import COUNT_MAX, SEED_MAX, Range
from repair.expansion.relevance_judge import DEFAULT_JUDGE_K, DEFAULT_JUDGE_MODEL, DEFAULT_THRESHOLD
from repair.models import DEFAULT_MODEL
from repair.training.config import CAUSALNEG_QEM_LAMBDA, TrainConfig


class SettingsError(ValueError):
    """One or more settings are invalid; ``problems`` holds one message per setting."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Setting:
    """One driver setting. ``kind`` picks the check; ``result`` = a rerun must use the same value, because the
    setting changes what a finished step produced (plumbing such as DEVICE or FORCE does not)."""

    name: str
    group: str
    default: str
    help: str
    kind: str = "text"  # int | float | choice | flag | text | model | path | file | adapter | special
    low: float | None = None  # int / float: the range (issue 44: every int has a high, COUNT_MAX or SEED_MAX)
    high: float | None = None
    low_open: bool = False  # range is (low, high] instead of [low, high]
    high_open: bool = False
    choices: tuple[str, ...] = ()
    result: bool = True
    shown_default: str | None = None  # the help's bracket text when the default is computed

    @property
    def range(self) -> Range:
        """The check of an int / float setting: the scripts' flag types (:mod:`repair.cli`) parse the same way."""
        return Range(self.kind == "int", self.low, self.high, self.low_open, self.high_open)


_s = Setting  # short name for the table below


def _trainer(field: str) -> str:
    """The trainer's own default for a Training setting, as the table writes it (``2e-5``, not ``2e-05``): each
    training default is written once, in :class:`repair.training.config.TrainConfig`."""
    return _number(TrainConfig.__dataclass_fields__[field].default)


def _number(value: float | int) -> str:
    """A number as a person writes it in a setting: ``2e-5``, ``0.02``, ``256``."""
    if isinstance(value, int):
        return str(value)
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:g}").replace("e+", "e")


SETTINGS: tuple[Setting, ...] = (
    _s("OUT_DIR", "Run", "runs/repair", "run folder", result=False),
    _s("ITERS", "Run", "2", "iterations (a larger value extends a finished run)", "int", 1, COUNT_MAX, result=False),
    _s("FORCE", "Run", "0", "1 = remove the run's markers and step outputs, then redo every step (also: accept "
       "settings that differ from the run's record)", "flag", result=False),
    _s("PYTHON", "Run", "", "interpreter", result=False, shown_default=".venv/bin/python if present, else python3"),
    _s("DEVICE", "Run", "", "cpu | cuda | cuda:N | mps", "special", result=False, shown_default="auto"),
    _s("NPROC", "Run", "1", "processes per node for torchrun (training) and for 07's encoding; >1 is opt-in "
       "multi-GPU", "int", 1, COUNT_MAX, result=False),
    _s("NNODES", "Run", "", "nodes of training and 07 (torchrun's c10d rendezvous; inside Slurm srun starts one "
       "launcher per node; OUT_DIR must be on a filesystem every node shares; repair/driver/launch.py)", "int", 1,
       COUNT_MAX, result=False, shown_default="$SLURM_NNODES, else 1"),
    _s("NODE_RANK", "Run", "", "this node's number (the driver runs on node 0; outside Slurm node 0 hosts the "
       "rendezvous)", "int", 0, COUNT_MAX, result=False, shown_default="$SLURM_NODEID, else 0"),
    _s("MASTER_ADDR", "Run", "", "rendezvous host of a multi-node step (outside Slurm: required when NNODES > 1)",
       result=False, shown_default='first name of scontrol show hostnames "$SLURM_JOB_NODELIST"'),
    _s("MASTER_PORT", "Run", "", "rendezvous port", "int", 1, 65535, result=False,
       shown_default="29500 + $SLURM_JOB_ID % 1000, else 29500"),
    _s("SEED", "Run", "42", "seed of training (init, dropout, data order) and, unless GEN_SEED is given, of "
       "generation", "int", 0, SEED_MAX),
    _s("GEN_SEED", "Run", "", "seed of what the LLM steps write (05, 06c, 09b: examples drawn, sampling); fixed, runs "
       "of several training SEEDs share one generation (nothing else before training takes a seed)", "int", 0,
       SEED_MAX,
       shown_default="SEED"),
    _s("MODEL", "Model", DEFAULT_MODEL, "retriever backbone: HF id, folder, alias smollm2-135m | minilm", "model"),
    _s("ADAPTER", "Model", "", "LoRA adapter folder to start from (iteration 1)", "adapter", shown_default="none"),
    _s("MAX_LENGTH", "Model", "512", "tokens per text incl. EOS", "int", 8, COUNT_MAX),
    _s("BATCH_SIZE", "Model", "32", "encoding batch size", "int", 1, COUNT_MAX, result=False),
    _s("TRAIN_DATA", "Data", "", "T0: original .pt, JSONL {query, positive}, or BEIR folder", "path",
       shown_default="unset = the demo profile"),
    _s("TRAIN_SPLIT", "Data", "train", "BEIR split of T0"),
    _s("EVAL_DATA", "Data", "", "space-separated eval specs PATH | TASK:PATH | NAME:TASK:PATH (empty = no eval)",
       "special", shown_default="none"),
    _s("EVAL_SPLIT", "Data", "test", "split evaluated on BEIR folders"),
    _s("PCT", "Diagnosis (Stage I)", "30", "bottom percentile of margins = Q_conf", "int", 1, 100),
    _s("DIA_TOP_K", "Diagnosis (Stage I)", "50", "top-k searched per query for the margin", "int", 2, COUNT_MAX),
    _s("TOP_NEG_N", "Diagnosis (Stage I)", "30", "D-(q): first non-positive hits per confused query", "int", 1,
       COUNT_MAX),
    _s("EXTRACTOR", "Diagnosis (Stage I)", "regex", "concept extractor", "choice", choices=("regex", "matdetector")),
    _s("NER_MODEL", "Diagnosis (Stage I)", "yerim0210/MatDetector",
       "token-classification model for EXTRACTOR=matdetector", "model"),
    _s("SOURCE", "Expansion (Stage II)", "local", "literature source", "choice",
       choices=("local", "semantic_scholar", "elsevier")),
    _s("LOCAL_CORPUS", "Expansion (Stage II)", "", "BEIR folder or JSONL {id,title,abstract} for SOURCE=local",
       "path", shown_default="TRAIN_DATA when it is a folder"),
    _s("LITERATURE_INDEX", "Expansion (Stage II)", "",
       "SOURCE=local: an on-disk literature index 06 verifies against instead of LOCAL_CORPUS (python -m "
       "repair.expansion.sources.literature build CORPUS... --index DIR; millions of papers)", "path",
       shown_default="none: LOCAL_CORPUS"),
    _s("S2_KEY_FILE", "Expansion (Stage II)", "", "Semantic Scholar keys, one per line (or $S2_API_KEY)", "file",
       result=False),
    _s("ELSEVIER_KEY_FILE", "Expansion (Stage II)", "",
       "Elsevier keys, one per line (or $ELSEVIER_API_KEY / $ELSEVIER_INSTTOKEN)", "file", result=False),
    _s("GROUNDING", "Expansion (Stage II)", "none", "attribute grounding (mp needs $MP_API_KEY)", "choice",
       choices=("none", "pubchem", "mp", "both")),
    _s("GENERATOR", "Expansion (Stage II)", "hf", "query generator backend", "choice", choices=("hf", "openai")),
    _s("GEN_MODEL", "Expansion (Stage II)", "", "generator model for hf; for openai: the served model", "model",
       shown_default="MODEL; openai: $OPENAI_MODEL or the server's first model"),
    _s("GEN_ADAPTER", "Expansion (Stage II)", "auto",
       "hf generator's LoRA: auto = the retriever's current adapter when GEN_MODEL is MODEL (the paper: M_theta "
       "writes the queries), none = the plain generator, or an adapter folder", "special"),
    _s("GEN_BACKEND", "Expansion (Stage II)", "hf",
       "hf generator's engine (05, 06c, 09b): hf = transformers; ct2 = CTranslate2 int8 on a copy converted once "
       "beside the model (docs/generators.md; falls back to hf when ctranslate2 is not installed)", "choice",
       choices=("hf", "ct2")),
    _s("OPENAI_URL", "Expansion (Stage II)", "", "OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama); several servers of one model "
       "comma-separated: requests spread over them, a failed one goes to another (issue 42)", "special",
       result=False, shown_default="$OPENAI_BASE_URL"),
    _s("OPENAI_EXTRA", "Expansion (Stage II)", "",
       "JSON object merged into every OpenAI-compatible request, e.g. llama.cpp's '{\"repeat_penalty\": 1.2}' (then "
       "no repetition_penalty field is sent: llama.cpp ignores it)", "special", shown_default="none"),
    _s("TARGET_K", "Expansion (Stage II)", "20", "max negative candidates per verified query", "int", 1, COUNT_MAX),
    _s("VALID_FACTOR", "Expansion (Stage II)", "2", "stop expansion at VALID_FACTOR x |T0| valid tuples", "int", 1,
       COUNT_MAX),
    _s("GEN_ROUND", "Expansion (Stage II)", "", "queries generated per 05 -> 06 round", "int", 1, COUNT_MAX,
       shown_default="max(16, |T0|)"),
    _s("MAX_ROUNDS", "Expansion (Stage II)", "6", "round limit of the 05 -> 06 loop", "int", 1, COUNT_MAX),
    _s("QUERY_FORM", "Expansion (Stage II)", "title",
       "what q_new is: title = the verified top hit's title (the paper); generated = the generator's own query; "
       "t0 = rewritten in T0's query style (expansion/06c_t0_style_queries.py); doc2query = no concept search: a "
       "query written from each of the first D2Q_DOCS documents that outrank a confused query's positive (Stage I's "
       "D-(q)), d+ = that document, candidates = the documents it was confused with (06c --doc2query, issue 30)",
       "choice", choices=("title", "generated", "t0", "doc2query")),
    _s("QUERY_STYLE", "Expansion (Stage II)", "auto",
       "the form QUERY_FORM=t0 / doc2query ask for: auto = T0's own (claims for SciFact); claim | question | "
       "keywords | title; mixed = claim, question, keyword query in turn (Tamber et al. 2025)", "choice",
       choices=("auto", "claim", "question", "keywords", "title", "mixed")),
    _s("QUERY_EXTRA", "Expansion (Stage II)", "",
       "extra flags for expansion/06c_t0_style_queries.py (QUERY_FORM=t0 / doc2query), e.g. '--k 1 "
       "--max_example_chars 300' (a shorter prompt: a CPU generator's time goes into reading it)"),
    _s("D2Q_DOCS", "Expansion (Stage II)", "1",
       "QUERY_FORM=doc2query: documents of each confused query's D-(q) that get a query (each document once)",
       "int", 1, COUNT_MAX),
    _s("JUDGE", "Expansion (Stage II)", "0",
       "1 = an instruct model judges each verified tuple's first JUDGE_K hits after every 06 (expansion/"
       "06d_judge_relevance.py, issue 30): P(yes) from its logits; the positive becomes the hit rated highest, a "
       "tuple with no hit at JUDGE_THRESHOLD is dropped, other hits at the threshold are never negatives; the "
       "rounds count the kept tuples; judgments cached in $OUT_DIR/cache/judge.jsonl", "flag"),
    _s("JUDGE_MODEL", "Expansion (Stage II)", "", "the judge for GENERATOR=hf: HF id, folder or alias (with "
       "GENERATOR=openai the judge is the generator's served model)", "model", shown_default=DEFAULT_JUDGE_MODEL),
    _s("JUDGE_THRESHOLD", "Expansion (Stage II)", _number(DEFAULT_THRESHOLD),
       "P(yes) at which the judge calls a hit relevant; measure the judge and choose it on T0's own claims first "
       "(bench/judge_accuracy.py: the Qwen2.5-Coder 0.5B / 1.5B judges were near chance on SciFact, docs/results.md)",
       "float", 0, 1),
    _s("JUDGE_K", "Expansion (Stage II)", str(DEFAULT_JUDGE_K),
       "hits judged per tuple (the positive + the first JUDGE_K - 1 candidates)", "int", 1, COUNT_MAX),
    _s("HARD_TUPLES", "Expansion (Stage II)", "0",
       "1 = keep only the verified tuples the current retriever gets wrong or nearly (issue 43; differentiation/"
       "06e_hard_tuples.py after each 06, or after 06c for QUERY_FORM=t0/doc2query): d+ not first among the source's "
       "hits, or margin s(q,d+) - max s(q,d-) below HARD_MARGIN, hardest first, guards against false labels", "flag"),
    _s("HARD_MARGIN", "Expansion (Stage II)", "0.1",
       "HARD_TUPLES=1: a tuple whose margin is below this is hard (choose it on dev)", "float", -2, 2),
    _s("HARD_BUDGET", "Expansion (Stage II)", "0",
       "HARD_TUPLES=1: keep at most this many hard tuples, lowest margin first (0 = all)", "int", 0, COUNT_MAX),
    _s("HARD_TARGET", "Expansion (Stage II)", "0",
       "HARD_TUPLES=1: generate rounds (up to MAX_ROUNDS) until this many hard tuples, instead of TARGET_VALID "
       "verified ones (0 = as without HARD_TUPLES; QUERY_FORM title/generated)", "int", 0, COUNT_MAX),
    _s("HARD_DUP", "Expansion (Stage II)", "0.95",
       "HARD_TUPLES=1 guard: drop a hard tuple whose preferred hit has passage cosine >= this to d+", "float", -1, 1),
    _s("HARD_LEX_TIE", "Expansion (Stage II)", "0.02",
       "HARD_TUPLES=1 guard: drop a hard tuple whose preferred hit the source scored within this share of d+'s "
       "score (a tie the search could not break; negative = off)", "float", -1, 1),
    _s("EXPANSION", "Expansion (Stage II)", "1", "0 = skip Stage II (needs CONFUSED_TUPLES=1: Stage III then sees "
       "only the diagnosed T0 queries)", "flag"),
    _s("TOP_K", "Differentiation (Stage III)", "15", "hard negatives kept per tuple (Eq. 7)", "int", 1, COUNT_MAX),
    _s("CONSISTENCY_K", "Differentiation (Stage III)", "5", "keep a tuple if rank(d+) <= kappa in its pool (Eq. 6)",
       "int", 1, COUNT_MAX),
    _s("POOL", "Differentiation (Stage III)", "local", "local (README) | global (original code)", "choice",
       choices=("local", "global")),
    _s("CONFUSED_TUPLES", "Differentiation (Stage III)", "0",
       "1 = Q_conf's own T0 queries also go through Stage III, their D-(q) (first TARGET_K non-positive hits) as "
       "candidates (differentiation/06b_confused_tuples.py)", "flag"),
    _s("FN_PCT", "Differentiation (Stage III)", "",
       "08's false-negative guard: drop candidates scoring above pos_score x FN_PCT, e.g. 0.95", "float", 0, 1,
       low_open=True, shown_default="off"),
    _s("FN_MARGIN", "Differentiation (Stage III)", "",
       "08's false-negative guard: drop candidates scoring above pos_score - FN_MARGIN", "float",
       shown_default="off"),
    _s("NEGATIVES", "Differentiation (Stage III)", "repair",
       "repair | causalneg (adds CoT counterfactual negatives + QEM)", "choice", choices=("repair", "causalneg")),
    _s("CN_K", "Differentiation (Stage III)", "3", "generated counterfactual negatives per query (causalneg)",
       "int", 1, COUNT_MAX),
    _s("CN_RATIO", "Differentiation (Stage III)", "1.0",
       "share of the kept tuples that get generated negatives (Sec. 4.5)", "float", 0, 1, low_open=True),
    _s("CN_EXTRA", "Differentiation (Stage III)", "",
       "extra flags for differentiation/09b_counterfactual_negatives.py"),
    _s("EPOCHS", "Training", _trainer("epochs"), "epochs per training", "int", 1, COUNT_MAX),
    _s("LR", "Training", _trainer("lr"), "AdamW learning rate", "float", 0, low_open=True),
    _s("TEMPERATURE", "Training", _trainer("temperature"), "InfoNCE temperature", "float", 0, low_open=True),
    _s("GLOBAL_BATCH", "Training", _trainer("global_batch_size"), "examples per optimizer step", "int", 1, COUNT_MAX),
    _s("MINI_BATCH", "Training", _trainer("mini_batch_size"), "GradCache chunk (memory only: same gradients)", "int",
       1, COUNT_MAX, result=False),
    _s("NUM_HARD_NEG", "Training", "", "hard negatives per triplet; -1 = all", "int", -1, COUNT_MAX,
       shown_default=f"{_trainer('num_hard_negatives')}; causalneg -1"),
    _s("WARMUP_RATIO", "Training", _trainer("warmup_ratio"),
       "linear warmup share of the steps (step 1 of a warmup trains with lr 0)", "float", 0, 1, high_open=True),
    _s("QEM_LAMBDA", "Training", "", "weight of the query-view entropy term", "float", 0,
       shown_default=f"{_trainer('qem_lambda')} for repair, {_number(CAUSALNEG_QEM_LAMBDA)} for causalneg"),
    _s("QEM_TAU", "Training", _trainer("qem_tau"), "QEM temperature", "float", 0, low_open=True),
    _s("T0_NEGATIVES", "Training", "none",
       "none = T0's queries train with in-batch negatives only (the paper); bm25 = each with its BM25-mined corpus "
       "negatives (differentiation/09b_counterfactual_negatives.py --config mined over LOCAL_CORPUS, else the "
       "TRAIN_DATA folder), issue 16's strongest plain baseline, under REPAIR's triplets (PROFILE=confused-bm25)",
       "choice", choices=("none", "bm25")),
    _s("WARM_START", "Training", "0",
       "1 = fine-tune MODEL on T0 alone first (T0_NEGATIVES' data, these training settings; step "
       "iter0.10_warm_start into $OUT_DIR/iter0/adapter): iteration 0 evaluates and iteration 1 diagnoses that "
       "model, not the backbone (issue 16's lever 4, PROFILE=confused-bm25-warm)", "flag"),
    _s("ITER_STEPS", "Training", "epochs",
       "epochs = each training runs EPOCHS over its data (T0 + the triplets so far); t0 = EPOCHS x ceil(|T0| / "
       "GLOBAL_BATCH) optimizer steps, what plain fine-tuning on T0 takes, whatever the triplets add (issue 16's "
       "equal-steps budget: REPAIR's tuples take batch slots instead of adding steps)", "choice",
       choices=("epochs", "t0")),
    _s("SCHEDULE", "Training", "restart",
       "restart = each training (the warm start, each iteration) runs its own LR schedule from warmup, with a fresh "
       "optimizer; one = they are consecutive slices of one schedule of (WARM_START + ITERS) x T0_STEPS steps: each "
       "goes on from the previous one's weights, AdamW moments, LR and step (training/10_train_lora.py --last_step "
       "/ --continue_from), so REPAIR's data changes mid-schedule and the plain run of that many steps is its exact "
       "control (issue 16's lever 4; needs ITER_STEPS=t0)", "choice", choices=("restart", "one")),
    _s("CONTROL", "Training", "0",
       "1 = also train each iteration's plain equal-steps control: the same training (start, steps, schedule slice, "
       "seed) on T0's data alone (T0_NEGATIVES'), into iter<k>/control, evaluated into iter<k>/eval_control; the "
       "report puts REPAIR beside it, so a run measures its own gain (needs ITER_STEPS=t0)", "flag"),
    _s("FULL_FINETUNE", "Training", "0", "1 = train every weight (no LoRA)", "flag"),
    _s("TRAIN_EXTRA", "Training", "", "extra flags passed to training/10_train_lora.py"),
)
