"""Which benchmark a path holds, and whether its files are there: everything decided before a model loads.

A benchmark is named by ``PATH``, ``TASK:PATH`` or ``NAME:TASK:PATH`` (:func:`parse_dataset_spec`); its name
picks the task family (:func:`infer_task`) and the query instruction (:func:`dataset_instruction`), and
:func:`check_dataset` fails fast, naming the missing file, where to get the data and the layout REPAIR
expects. This is apart from :mod:`repair.evaluation.evaluate` (which scores a retriever on the data) because it is
the user-facing contract of the ``eval/`` scripts: names, paths, sources and messages, no metrics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from repair.data import DataError

TASKS = ("ir", "qa", "mesh", "relish", "sts")  # task families (metric profiles: repair.evaluation.evaluate.PROFILES)

# Where a user gets each benchmark (none but BIOSSES ships with REPAIR; docs/evaluation.md has the details).
BEIR_URL = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/{}.zip"
DATA_SOURCES: dict[str, str] = {
    "nfcorpus": "BEIR NFCorpus: " + BEIR_URL.format("nfcorpus") + " (unzip; pass the nfcorpus/ folder)",
    "scifact": "BEIR SciFact: " + BEIR_URL.format("scifact") + " (unzip; pass the scifact/ folder)",
    "scidocs": "BEIR SCIDOCS: " + BEIR_URL.format("scidocs") + " (unzip; pass the scidocs/ folder)",
    "trec-covid": "BEIR TREC-COVID: " + BEIR_URL.format("trec-covid") + " (unzip; pass the trec-covid/ folder)",
    "biosses": "BIOSSES ships with REPAIR in data/biosses/biosses.jsonl (GPL-3.0; authors' repository "
               "github.com/gizemsogancioglu/biosses)",
    "icliniq": "iCliniq (patient questions / doctor answers) is not shipped: build a BEIR folder from the "
               "iCliniq-10k dump linked in github.com/Kent0n-Li/ChatDoctor (one query per question, its answer "
               "as the only relevant document)",
    "chemlit": "ChemLit-QA is not shipped: build a BEIR folder from github.com/geemi725/ChemLit-QA (question -> "
               "its context passage); the paper reports a materials and a biomedical subset",
    "mesh": "MeSH is not shipped: build a BEIR folder from the NLM MeSH descriptors "
            "(https://www.nlm.nih.gov/databases/download/mesh.html): query = descriptor name, document text = "
            "its scope note, qrels query -> its own descriptor",
    "relish": "RELISH is not shipped: get it from the RELISH consortium (Brown et al. 2019, Database) or "
              "SciRepEval's 'relish' config (allenai/scirepeval), as a BEIR folder with graded 0-2 qrels "
              "over each query's candidate pool",
}
LAYOUTS: dict[str, str] = {
    "beir": "a BEIR folder: corpus.jsonl[.gz] ({_id, title, text} per line), queries.jsonl ({_id, text}) and "
            "qrels/<split>.tsv (header, then query-id<TAB>corpus-id<TAB>score)",
    "sts": "a JSONL file of {id, sentence1, sentence2, score} lines, a TSV with those header columns, or a "
           "folder holding one such file",
}


class DataNotFound(FileNotFoundError):
    """A benchmark's data is not where the user said; the message says where to get it."""


@dataclass(frozen=True)
class DatasetSpec:
    """One benchmark to evaluate: a display name (also picks the instruction), a task family and a path."""

    name: str
    task: str
    path: Path
    options: dict = field(default_factory=dict, compare=False)


_TASK_HINTS = {"biosses": "sts", "sts": "sts", "mesh": "mesh", "icliniq": "qa", "chemlit": "qa",
               "relish": "relish"}


# The benchmark a task family stands for when a dataset's name has no instruction of its own (a MeSH folder
# called "test" still gets the MeSH instruction, as REPAIR's eval_mesh.py always used it).
TASK_DEFAULT_DATASET = {"mesh": "mesh", "sts": "biosses", "relish": "relish"}


def dataset_instruction(name: str, task: str, override: str | None = None) -> str:
    """The query instruction for a dataset: ``override``, else the name's entry in :mod:`repair.evaluation.instructions`,
    else the task family's benchmark entry, else the generic default."""
    from repair.encoding import DEFAULT_INSTRUCTION  # torch: here, so the driver's settings check can use this module
    from repair.evaluation.instructions import instruction_for

    if override is not None:
        return override
    found = instruction_for(name)
    if found == DEFAULT_INSTRUCTION and task in TASK_DEFAULT_DATASET:
        return instruction_for(TASK_DEFAULT_DATASET[task])
    return found


def infer_task(name: str) -> str:
    """Task family from a dataset/folder name (its alphanumeric tokens), ``ir`` when nothing matches."""
    for token in re.split(r"[^a-z0-9]+", name.lower()):
        for hint, task in _TASK_HINTS.items():
            if token.startswith(hint):
                return task
    return "ir"


def dataset_name(path: str | Path) -> str:
    """Name of a dataset path: the folder's name, or a file's stem without ``.jsonl``/``.tsv``/``.gz``."""
    p = Path(str(path).rstrip("/\\"))
    name = p.name if p.name not in ("", ".", "..") else p.resolve().name
    for suffix in (".gz", ".jsonl", ".tsv", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or str(path)


def parse_dataset_spec(text: str) -> DatasetSpec:
    """``PATH`` (task inferred from the folder name), ``TASK:PATH`` or ``NAME:TASK:PATH``.

    A colon form whose task field is a word but not one of :data:`TASKS` (``scifact:irr:PATH``) is a
    ``ValueError`` naming that task; read as a path it would only say that ``scifact:irr:PATH`` does not exist.
    """
    parts = text.split(":", 2)
    if len(parts) == 3 and parts[1] in TASKS:
        return DatasetSpec(parts[0] or dataset_name(parts[2]), parts[1], Path(parts[2]))
    if len(parts) >= 2 and parts[0] in TASKS:
        path = text.split(":", 1)[1]
        return DatasetSpec(dataset_name(path), parts[0], Path(path))
    if len(parts) >= 2 and not Path(text).exists():
        task = parts[1] if len(parts) == 3 else parts[0]
        if re.fullmatch(r"[A-Za-z0-9_.-]+", task):
            form = "NAME:TASK:PATH" if len(parts) == 3 else "TASK:PATH"
            raise ValueError(f"dataset '{text}': unknown task '{task}' in {form} (expected one of "
                             f"{', '.join(TASKS)})")
    name = dataset_name(text)
    return DatasetSpec(name, infer_task(name), Path(text))


def data_source(name: str) -> str | None:
    key = name.lower()
    for source_name, text in DATA_SOURCES.items():
        if key.startswith(source_name) or source_name in re.split(r"[^a-z0-9-]+", key):
            return text
    return None


def where_to_get(name: str, task: str) -> str:
    """Where a benchmark comes from and the layout REPAIR expects (for error messages)."""
    source = data_source(name)
    layout = LAYOUTS["sts" if task == "sts" else "beir"]
    return (f"Get it: {source}. " if source else "") + f"Expected {layout}. See docs/evaluation.md."


def missing_data_message(spec: DatasetSpec, what: str | None = None) -> str:
    """One clear paragraph: what is missing, where to get the data, what layout is expected."""
    return f"{what or spec.path}: not found ({spec.name}, task {spec.task}). {where_to_get(spec.name, spec.task)}"


def check_dataset(spec: DatasetSpec, split: str = "test") -> None:
    """Fail fast, before any model loads, when a benchmark's files are missing (:class:`DataNotFound`)."""
    if spec.task not in TASKS:
        raise ValueError(f"{spec.name}: unknown task {spec.task!r} (expected one of {', '.join(TASKS)})")
    if not spec.path.exists():
        raise DataNotFound(missing_data_message(spec))
    if spec.task == "sts":
        if spec.path.is_dir():
            try:
                sts_pairs_file(spec.path)
            except FileNotFoundError:
                raise DataNotFound(missing_data_message(spec, f"{spec.path}/*.jsonl")) from None
        return
    if not spec.path.is_dir():
        raise DataNotFound(missing_data_message(spec, f"{spec.path} (a file; a BEIR folder is expected)"))
    needed = [spec.path / "corpus.jsonl", spec.path / "queries.jsonl", spec.path / "qrels" / f"{split}.tsv"]
    for f in needed:
        if not f.exists() and not f.with_name(f.name + ".gz").exists():
            raise DataNotFound(missing_data_message(spec, f"{f}[.gz]"))


def sts_pairs_file(path: Path) -> Path:
    """A folder holding exactly one ``*.jsonl`` (preferred) or ``*.tsv`` file resolves to that file."""
    for pattern in ("*.jsonl", "*.jsonl.gz", "*.tsv", "*.tsv.gz"):
        found = sorted(path.glob(pattern))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            preferred = [f for f in found if f.name.split(".")[0] == path.name]
            if len(preferred) == 1:
                return preferred[0]
            raise DataError(f"{path}: several {pattern} files ({', '.join(f.name for f in found)}); "
                            "pass the pairs file itself")
    raise FileNotFoundError(f"{path}: no *.jsonl or *.tsv sentence-pair file in this folder")
