"""Resolving, checking and recording the driver's settings (the table itself: :mod:`repair.driver.settings_table`;
the run folder's record of them: :mod:`repair.driver.run_record`).

Why in Python: the driver used to check a few settings in bash and let the rest fail minutes into a run
(``PCT=150`` failed in step 01 after the baseline evaluation), and a rerun in a finished run folder silently
ignored changed settings. Here each rule is one table entry, tested in ``tests/test_settings.py``, and a check
takes a fraction of a second (no torch import).

Resolution, highest first: a non-empty environment variable, the profile
(``PROFILE=demo | demo-tiny | confused | FILE``, ``configs/*.env``; ``DEMO=full|tiny`` is an alias used when
TRAIN_DATA is unset), the table's default.
The driver calls ``python -m repair.driver.settings resolve``: it validates everything, reads |T0|, compares with the run
folder's ``settings.json`` (the settings its finished steps were made with) and prints shell assignments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

from repair.cli import COUNT_MAX
from repair.driver.run_record import RECORD_FILE, check_and_record, record_of, without_credentials  # noqa: F401
from repair.driver.settings_table import SETTINGS, SettingsError
from repair.expansion.relevance_judge import DEFAULT_JUDGE_MODEL
from repair.expansion.server_pool import split_urls
from repair.expansion.sources.literature_format import is_literature_index
from repair.models import check_adapter_weights, check_model_name
from repair.training.config import CAUSALNEG_QEM_LAMBDA, TrainConfig, epoch_steps

PROFILE_DIR = "configs"
ROOT_VARIABLE = "REPAIR_ROOT"  # ${REPAIR_ROOT} in a profile value = the repository root
PROFILE_NOTE_KEY = "ABOUT"  # a profile's one-line description (banner and --help)

BY_NAME = {s.name: s for s in SETTINGS}
DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


# A model that only an opt-in step loads is checked only when that step runs (a default alias whose packages a user
# never installed must not stop a run that does not use it).
OPTIONAL_MODEL_USED = {
    "NER_MODEL": lambda v: v["EXTRACTOR"] == "matdetector",
    "JUDGE_MODEL": lambda v: v["JUDGE"] == "1" and v["GENERATOR"] == "hf",  # openai: the generator's server judges
}


@dataclass
class Profile:
    name: str
    path: Path
    values: dict[str, str]
    lines: dict[str, int]  # setting -> line number in the file, for messages
    about: str = ""


@dataclass
class Resolved:
    values: dict[str, str]
    origin: dict[str, str]  # setting -> "environment" | "<profile file>:<line>" | "default" | "computed"
    profile: Profile | None


# ------------------------------------------------------------------------------------------ profiles
def profile_names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / PROFILE_DIR).glob("*.env"))


def read_profile(path: Path, root: Path, name: str | None = None) -> Profile:
    """``KEY=VALUE`` lines (``#`` comments, optional quotes, ``${REPAIR_ROOT}`` = the repository root).

    Values are literal (no shell evaluation), so a profile is data the driver can check line by line."""
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    about = ""
    problems = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if value[:1] not in ("'", '"'):  # an unquoted value ends at a comment
            value = value.split(" #", 1)[0].rstrip()
        if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            problems.append(f"{path}:{lineno}: expected KEY=VALUE, got {raw!r}")
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in ("'", '"'):
            value = value[1:-1]
        value = value.replace("${" + ROOT_VARIABLE + "}", str(root)).replace("$" + ROOT_VARIABLE, str(root))
        if key == PROFILE_NOTE_KEY:
            about = value
        elif key not in BY_NAME:
            problems.append(f"{path}:{lineno}: unknown setting {key!r} (see bash run_repair.sh --help)")
        else:
            values[key], lines[key] = value, lineno
    if problems:
        raise SettingsError(problems)
    return Profile(name or path.stem, path, values, lines, about)


def choose_profile(environ: Mapping[str, str], root: Path) -> Profile | None:
    """PROFILE wins; else DEMO (full -> demo, tiny -> demo-tiny) when TRAIN_DATA is unset; else none."""
    name = environ.get("PROFILE", "")
    if not name and not environ.get("TRAIN_DATA"):
        demo = environ.get("DEMO", "") or "full"
        if demo not in ("full", "tiny"):
            raise SettingsError([f"DEMO must be full or tiny, got {demo!r}"])
        name = "demo" if demo == "full" else "demo-tiny"
    if not name:
        return None
    if name in profile_names(root):
        return read_profile(root / PROFILE_DIR / f"{name}.env", root, name)
    path = Path(name).expanduser()
    if not path.is_file():
        known = " | ".join(profile_names(root))
        raise SettingsError([f"PROFILE must be {known} or a profile file, got {name!r} (no such file)"])
    return read_profile(path, root)


# ------------------------------------------------------------------------------------------ resolution
def resolve(environ: Mapping[str, str], root: Path) -> Resolved:
    """Effective settings: environment (non-empty) > profile > default, then the computed defaults."""
    profile = choose_profile(environ, root)
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    for s in SETTINGS:
        if environ.get(s.name, "") != "":
            values[s.name], origin[s.name] = environ[s.name], "environment"
        elif profile and s.name in profile.values:
            values[s.name], origin[s.name] = profile.values[s.name], f"{profile.path}:{profile.lines[s.name]}"
        else:
            values[s.name], origin[s.name] = s.default, "default"
    computed = {
        "GEN_MODEL": values["MODEL"],
        "GEN_SEED": values["SEED"],
        "JUDGE_MODEL": DEFAULT_JUDGE_MODEL,
        # causalneg trains on every negative of a line with QEM; plain REPAIR on the trainer's own defaults
        "NUM_HARD_NEG": "-1" if values["NEGATIVES"] == "causalneg" else str(TrainConfig.num_hard_negatives),
        "QEM_LAMBDA": (str(CAUSALNEG_QEM_LAMBDA) if values["NEGATIVES"] == "causalneg"
                       else f"{TrainConfig.qem_lambda:g}"),
        "OPENAI_URL": environ.get("OPENAI_BASE_URL", ""),
        "LOCAL_CORPUS": "",
    }
    train_data = values["TRAIN_DATA"]
    if values["SOURCE"] == "local" and train_data and Path(train_data).expanduser().is_dir():
        computed["LOCAL_CORPUS"] = train_data  # the T0 folder's own corpus verifies the generated queries
    for name, value in computed.items():
        if values[name] == "":
            values[name], origin[name] = value, "computed"
    return Resolved(values, origin, profile)


# ------------------------------------------------------------------------------------------ validation
def _where(resolved: Resolved, name: str) -> str:
    origin = resolved.origin.get(name, "default")
    return "" if origin in ("environment", "default", "computed") else f" (from {origin})"


def _looks_like_path(value: str) -> bool:
    """A local path rather than a Hugging Face id (``org/name``): absolute, ~, ./ or ../, or 3+ parts."""
    return value.startswith(("/", "~", "./", "../")) or value.count("/") >= 2 or value in (".", "..")


def _adapter_problem(name: str, value: str) -> str | None:
    """A LoRA adapter folder whose weights load with ``weights_only=True`` (checked here, not at the step that first
    loads it: issue 44)."""
    from repair.data import DataError

    if not (Path(value).expanduser() / "adapter_config.json").is_file():
        return f"{name} must be a LoRA adapter folder (no adapter_config.json in '{value}')"
    try:
        check_adapter_weights(Path(value).expanduser())
    except DataError as exc:
        return f"{name}: {exc}"
    return None


# The folders every run writes into before its first step (run_repair.sh: mkdir -p $OUT_DIR/logs $OUT_DIR/.state).
RUN_FOLDERS = ("logs", ".state")


def _out_dir_problem(value: str) -> str | None:
    """OUT_DIR must be a folder this user may write, or one it may create (its nearest existing parent writable).
    Issue 44: a root-owned folder, a subfolder of one, or another user's finished run ended in a PermissionError
    traceback from :func:`check_and_record`. ``os.access`` asks the kernel (permissions, a read-only mount) without
    writing anything (``--no_record`` leaves OUT_DIR untouched)."""
    out = Path(os.path.abspath(os.path.expanduser(value)))
    # os.path.exists: False (not an exception) where a parent denies the look (OUT_DIR=/root/run as a user)
    existing = next(p for p in (out, *out.parents) if os.path.exists(p) or p == p.parent)
    if not os.path.isdir(existing):
        return f"OUT_DIR {value}: {existing} is a file, not a folder (choose another OUT_DIR)"
    if existing != out:
        if not os.access(existing, os.W_OK | os.X_OK):
            return (f"OUT_DIR {value} cannot be created: {existing} is not writable by this user (choose another "
                    f"OUT_DIR)")
        return None
    for folder in (out, *(out / name for name in RUN_FOLDERS)):
        if os.path.exists(folder) and not os.access(folder, os.W_OK | os.X_OK):
            where = "" if folder == out else f": its folder {folder.name} is not"
            return f"OUT_DIR {value} is not writable by this user{where} (choose another OUT_DIR)"
    return None


def _seed_split_problem(path: Path, split: str) -> str | None:
    """A BEIR T0 folder must hold the split's qrels (the error lists the splits it has)."""
    qrels = path / "qrels"
    if not path.is_dir() or not qrels.is_dir():
        return None  # not BEIR: the seed loader's own message names the file and field
    if (qrels / f"{split}.tsv").exists() or (qrels / f"{split}.tsv.gz").exists():
        return None
    have = sorted({p.name.split(".")[0] for p in qrels.glob("*.tsv*")})
    return f"TRAIN_SPLIT={split!r}: {qrels} has no {split}.tsv (splits there: {', '.join(have) or 'none'})"


def _eval_spec_problem(spec: str, split: str) -> str | None:
    """What the evaluation would refuse about one EVAL_DATA entry (its form, task and files for ``split``), found by
    the very checks it runs before loading a model (:func:`repair.evaluation.benchmarks.check_dataset`)."""
    from repair.evaluation.benchmarks import check_dataset, parse_dataset_spec
    from repair.data import DataError

    path = spec.rsplit(":", 1)[-1]
    try:
        parsed = parse_dataset_spec(spec)
        parsed = type(parsed)(parsed.name, parsed.task, parsed.path.expanduser(), parsed.options)
        if not parsed.path.exists():
            return f"EVAL_DATA entry not found: {path} (from '{spec}')"
        check_dataset(parsed, split)
    except (ValueError, OSError, DataError) as exc:
        return f"EVAL_DATA entry '{spec}': {exc}"
    return None


def validate(resolved: Resolved, environ: Mapping[str, str], check_installed: bool = True) -> list[str]:
    """Every problem with the settings, one message each naming the setting (empty = all good).
    ``check_installed=False`` accepts a model alias whose packages this machine lacks (a configuration checked for
    use elsewhere, e.g. a study's rows on a machine without ``GENERATORS=1``); every other check still runs."""
    v = resolved.values
    problems: list[str] = []

    def bad(name: str, message: str) -> None:
        problems.append(message + _where(resolved, name))

    numbers: dict[str, float] = {}
    for s in SETTINGS:
        value = v[s.name]
        if s.kind in ("int", "float"):
            if (value == "" and s.shown_default) or resolved.origin.get(s.name) == "computed":
                continue  # computed later (GEN_ROUND needs |T0|), or a copy checked as its source (GEN_SEED = SEED)
            try:  # the table's range, checked as the scripts' flag types check theirs (repair.cli.Range)
                numbers[s.name] = s.range.parse(value)
            except ValueError as exc:
                bad(s.name, f"{s.name} {exc}")
        elif s.kind == "flag" and value not in ("0", "1"):
            bad(s.name, f"{s.name} must be 0 or 1, got {value!r}")
        elif s.kind == "choice" and value not in s.choices:
            bad(s.name, f"{s.name} must be {', '.join(s.choices[:-1])} or {s.choices[-1]}, got {value!r}")
        elif s.kind == "model" and OPTIONAL_MODEL_USED.get(s.name, lambda _: True)(v) \
                and not (s.name == "GEN_MODEL" and value == v["MODEL"]):  # MODEL's own check covers it
            if not value:
                bad(s.name, f"{s.name} must not be empty")
            elif _looks_like_path(value) and not Path(value).expanduser().exists():
                bad(s.name, f"{s.name} not found: {value} (a local model folder; a Hugging Face id looks like "
                            f"org/name)")
            elif not (s.name == "GEN_MODEL" and v["GENERATOR"] == "openai"):  # openai: a served model's name
                problem = check_model_name(value, environ, check_installed)
                if problem:
                    bad(s.name, f"{s.name} {problem}" if problem.startswith("not found") else f"{s.name}: {problem}")
        elif s.kind == "adapter" and value:
            problem = _adapter_problem(s.name, value)
            if problem:
                bad(s.name, problem)
        elif s.kind == "file" and value and not Path(value).expanduser().is_file():
            bad(s.name, f"{s.name} not found: {value}")
    if not v["TRAIN_DATA"]:
        where = f" or in {resolved.profile.path}" if resolved.profile else ""
        bad("TRAIN_DATA", f"TRAIN_DATA is not set (set it in the environment{where}; unset PROFILE for the demo)")
    elif not Path(v["TRAIN_DATA"]).expanduser().exists():
        bad("TRAIN_DATA", f"TRAIN_DATA not found: {v['TRAIN_DATA']}")
    else:
        problem = _seed_split_problem(Path(v["TRAIN_DATA"]).expanduser(), v["TRAIN_SPLIT"])
        if problem:
            bad("TRAIN_SPLIT", problem)
    for name in ("TRAIN_SPLIT", "EVAL_SPLIT"):
        if not v[name]:
            bad(name, f"{name} must not be empty")
    for spec in v["EVAL_DATA"].split():
        problem = _eval_spec_problem(spec, v["EVAL_SPLIT"])
        if problem:
            bad("EVAL_DATA", problem)
    train_data_found = bool(v["TRAIN_DATA"]) and Path(v["TRAIN_DATA"]).expanduser().exists()
    if v["LITERATURE_INDEX"] and (v["SOURCE"] != "local" or not is_literature_index(v["LITERATURE_INDEX"])):
        bad("LITERATURE_INDEX", f"LITERATURE_INDEX needs SOURCE=local and a built index: {v['LITERATURE_INDEX']}")
    elif v["SOURCE"] == "local" and not v["LITERATURE_INDEX"]:  # issue 41: an index in LOCAL_CORPUS's place
        if not v["LOCAL_CORPUS"] and train_data_found:  # (a missing TRAIN_DATA is the one problem to name)
            bad("LOCAL_CORPUS", "SOURCE=local needs LOCAL_CORPUS (a BEIR folder or JSONL of papers); it defaults "
                                "to TRAIN_DATA only when that is a folder")
        elif not Path(v["LOCAL_CORPUS"]).expanduser().exists():
            bad("LOCAL_CORPUS", f"LOCAL_CORPUS not found: {v['LOCAL_CORPUS']}")
    if v["GROUNDING"] in ("mp", "both") and not environ.get("MP_API_KEY"):
        bad("GROUNDING", f"GROUNDING={v['GROUNDING']} needs a Materials Project key in $MP_API_KEY")
    if v["GEN_ADAPTER"] not in ("auto", "none"):
        problem = _adapter_problem("GEN_ADAPTER", v["GEN_ADAPTER"])
        if problem:
            bad("GEN_ADAPTER", problem.replace("must be a", "must be auto, none or a"))
    if v["OUT_DIR"]:
        problem = _out_dir_problem(v["OUT_DIR"])
        if problem:
            bad("OUT_DIR", problem)
    if v["DEVICE"] and not DEVICE_RE.match(v["DEVICE"]):
        bad("DEVICE", f"DEVICE must be cpu, cuda, cuda:N or mps, got {v['DEVICE']!r}")
    if v["OPENAI_EXTRA"]:
        try:
            extra = json.loads(v["OPENAI_EXTRA"])
        except json.JSONDecodeError as exc:
            extra = exc
        if not isinstance(extra, dict):
            bad("OPENAI_EXTRA", f"OPENAI_EXTRA must be a JSON object, got {v['OPENAI_EXTRA']!r}")
    for url in split_urls(v["OPENAI_URL"]) if v["OPENAI_URL"].strip() else []:  # several servers: comma-separated
        if urlsplit(url).scheme not in ("http", "https"):
            bad("OPENAI_URL", f"OPENAI_URL must be an http(s):// URL (several servers: comma-separated), got "
                              f"{without_credentials(url)!r}")
    if "TOP_K" in numbers and "CONSISTENCY_K" in numbers and numbers["TOP_K"] < numbers["CONSISTENCY_K"]:
        bad("TOP_K", f"TOP_K ({v['TOP_K']}) must be >= CONSISTENCY_K ({v['CONSISTENCY_K']}): 09 decides "
                     f"rank(d+) <= kappa from 08's top-k list")
    if (v["T0_NEGATIVES"] == "bm25" and not v["LOCAL_CORPUS"] and train_data_found
            and not Path(v["TRAIN_DATA"]).expanduser().is_dir()):
        bad("T0_NEGATIVES", "T0_NEGATIVES=bm25 mines T0's negatives from LOCAL_CORPUS (a BEIR folder or JSONL of "
                            "papers); it defaults to TRAIN_DATA only when that is a folder")
    if v["JUDGE"] == "1" and v["EXPANSION"] == "0":
        bad("JUDGE", "JUDGE=1 judges Stage II's verified tuples: it needs EXPANSION=1")
    if v["JUDGE"] == "1" and v["QUERY_FORM"] == "doc2query":
        bad("JUDGE", "JUDGE=1 judges 06's verified tuples; QUERY_FORM=doc2query writes none (its positive is the "
                     "document the query was written from)")
    if v["HARD_TUPLES"] == "1" and v["EXPANSION"] == "0":
        bad("HARD_TUPLES", "HARD_TUPLES=1 selects among Stage II's verified tuples: it needs EXPANSION=1")
    if v["HARD_TARGET"] not in ("", "0") and v["HARD_TUPLES"] != "1":
        bad("HARD_TARGET", "HARD_TARGET counts the hard tuples of HARD_TUPLES=1: set HARD_TUPLES=1 or HARD_TARGET=0")
    if v["HARD_TARGET"] not in ("", "0") and v["QUERY_FORM"] in ("t0", "doc2query"):
        bad("HARD_TARGET", f"HARD_TARGET counts hard tuples in the 05 -> 06 rounds; QUERY_FORM={v['QUERY_FORM']} "
                           "writes its queries after them (06c), so there is nothing to count: use HARD_BUDGET, "
                           "and D2Q_DOCS / GEN_ROUND for volume")
    if v["EXPANSION"] == "0" and v["CONFUSED_TUPLES"] != "1":
        bad("EXPANSION", "EXPANSION=0 needs CONFUSED_TUPLES=1: without Stage II's tuples Stage III has no input")
    if v["ITER_STEPS"] == "t0" and any(flag.split("=")[0] == "--max_steps" for flag in v["TRAIN_EXTRA"].split()):
        bad("ITER_STEPS", "ITER_STEPS=t0 sets each training's --max_steps; TRAIN_EXTRA gives one too "
                          f"({v['TRAIN_EXTRA']!r}): keep one of them")
    if v["CONTROL"] == "1" and v["ITER_STEPS"] != "t0":
        bad("CONTROL", "CONTROL=1 trains the control for the steps REPAIR's training takes: it needs ITER_STEPS=t0 "
                       "(with ITER_STEPS=epochs the tuples add steps the control would not have)")
    if v["SCHEDULE"] == "one" and v["ITER_STEPS"] != "t0":
        bad("SCHEDULE", "SCHEDULE=one splits one schedule into equal slices of T0_STEPS: it needs ITER_STEPS=t0")
    return problems


# ------------------------------------------------------------------------------------------ help
def help_text(root: Path) -> str:
    """The settings list of ``run_repair.sh --help``: defaults from the table, profile values from configs/."""
    profiles = []
    for name in profile_names(root):
        try:
            profiles.append(read_profile(root / PROFILE_DIR / f"{name}.env", root, name))
        except SettingsError:
            continue
    lines = ["Profiles (PROFILE=NAME or PROFILE=FILE; unset with TRAIN_DATA unset: demo, or DEMO=tiny: demo-tiny)"]
    for p in profiles:
        lines.append(f"  {p.name:<15} {PROFILE_DIR}/{p.path.name}: {p.about}")
    lines += ["", "Settings (default in brackets, then each profile's value where it sets one; an environment "
                  "variable wins)"]
    group = None
    for s in SETTINGS:
        if s.group != group:
            group = s.group
            lines.append(group)
        default = s.shown_default if s.shown_default is not None else (s.default or "none")
        extra = "; ".join(f"{p.name} {p.values[s.name].replace(str(root) + '/', '')}" for p in profiles
                          if s.name in p.values)
        choices = f"{' | '.join(s.choices)}: " if s.kind == "choice" and " | " not in s.help else ""
        lines.append(f"  {s.name:<15} {choices}{s.help} [{default}{'; ' + extra if extra else ''}]")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ CLI for the driver
def training_set_size(train_data: str, split: str) -> int:
    """|T0| (the driver sizes GEN_ROUND and the expansion target with it); reading T0 here also means a malformed
    T0 stops the run before any work, with the loader's file:line:field message."""
    from repair.data import DataError, load_seed

    try:
        return len(load_seed(os.path.expanduser(train_data), split=split))
    except (DataError, OSError) as exc:
        raise SettingsError([f"TRAIN_DATA: {exc}"]) from None


def derived_counts(values: Mapping[str, str], t0_size: int) -> dict[str, int]:
    """T0_SIZE, T0_STEPS (ITER_STEPS=t0's budget, the trainer's count) and TARGET_VALID (VALID_FACTOR x |T0|), in
    Python's integers: bash's arithmetic wrapped VALID_FACTOR=576460752303423488 into a negative target (issue 44).
    Each must fit the scripts' count flags (:data:`repair.cli.COUNT_MAX`), else :class:`SettingsError`."""
    t0_steps = epoch_steps(t0_size, int(values["GLOBAL_BATCH"]), int(values["EPOCHS"]))
    counts = {"T0_SIZE": t0_size, "T0_STEPS": t0_steps, "TARGET_VALID": int(values["VALID_FACTOR"]) * t0_size}
    problems = []
    if counts["TARGET_VALID"] > COUNT_MAX:
        problems.append(f"VALID_FACTOR x |T0| (Stage II's target of valid tuples) must be at most {COUNT_MAX}, got "
                        f"{values['VALID_FACTOR']} x {t0_size} = {counts['TARGET_VALID']}")
    one = values["SCHEDULE"] == "one"  # one schedule of (WARM_START + ITERS) x T0_STEPS steps
    steps = (int(values["ITERS"]) + int(values["WARM_START"]) if one else 1) * t0_steps
    if values["ITER_STEPS"] == "t0" and steps > COUNT_MAX:
        problems.append(f"ITER_STEPS=t0: a training's schedule, {'(WARM_START + ITERS) x ' if one else ''}EPOCHS x "
                        f"ceil(|T0| / GLOBAL_BATCH) optimizer steps, must be at most {COUNT_MAX}, got {steps}")
    if problems:
        raise SettingsError(problems)
    return counts


def shell_assignments(resolved: Resolved) -> str:
    """``NAME='value'`` lines for the driver's ``eval`` (plus the profile's name, file and description)."""
    lines = [f"{name}={shlex.quote(value)}" for name, value in resolved.values.items()]
    p = resolved.profile
    lines += [f"PROFILE_NAME={shlex.quote(p.name if p else '')}",
              f"PROFILE_FILE={shlex.quote(str(p.path) if p else '')}",
              f"PROFILE_ABOUT={shlex.quote(p.about if p else '')}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repair.driver.settings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("resolve", "help"),
                        help="resolve: validate the environment's settings, check/write OUT_DIR/settings.json and "
                             "print shell assignments; help: the settings list")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="repository root")
    parser.add_argument("--no_record", action="store_true", help="validate only: leave OUT_DIR untouched")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.command == "help":
        sys.stdout.write(help_text(root) + "\n")
        return 0
    try:
        resolved = resolve(os.environ, root)
        problems = validate(resolved, os.environ)
        if problems:
            raise SettingsError(problems)
        t0_size = training_set_size(resolved.values["TRAIN_DATA"], resolved.values["TRAIN_SPLIT"])
        counts = derived_counts(resolved.values, t0_size)
        if not args.no_record:
            check_and_record(Path(resolved.values["OUT_DIR"]).expanduser(), resolved.values,
                             force=resolved.values["FORCE"] == "1")
    except SettingsError as exc:
        for problem in exc.problems:
            sys.stderr.write(problem + "\n")
        return 2
    sys.stdout.write(shell_assignments(resolved) + "".join(f"{name}={n}\n" for name, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
