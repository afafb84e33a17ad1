"""Per-benchmark query instructions (the ``{instruction}`` of the query format).

BEIR sets: BMRetriever's ``prompt.py`` table (UPSTREAM.md 6), copied as exact strings because the
published numbers depend on them. MeSH: REPAIR's ``eval_mesh.py`` string. BIOSSES, iCliniq, ChemLit-QA and
RELISH have no instruction in any available source; the strings below are our choice (docs/evaluation.md)
and every eval script accepts ``--instruction`` to override.
"""

from __future__ import annotations

from repair.encoding import DEFAULT_INSTRUCTION

INSTRUCTIONS: dict[str, str] = {
    # BMRetriever prompt.py (exact strings)
    "nfcorpus": "Given a question, retrieve relevant documents that best answer the question",
    "scidocs": "Given a scientific paper title, retrieve paper abstracts that are cited by the given paper",
    "scifact": "Given a scientific claim, retrieve documents that support or refute the claim",
    "trec-covid": "Given a query on COVID-19, retrieve documents that answer the query",
    "msmarco": "Given a web search query, retrieve relevant passages that answer the query",
    "nq": "Given a question, retrieve Wikipedia passages that answer the question",
    "fever": "Given a claim, retrieve documents that support or refute the claim",
    "hotpotqa": "Given a multi-hop question, retrieve documents that can help answer the question",
    "quora": "Given a question, retrieve questions that are semantically equivalent to the given question",
    # REPAIR eval_mesh.py
    "mesh": "Given a concept, retrieve passages for its definition.",
    # our choices (docs/evaluation.md, "Instructions")
    "biosses": "Retrieve semantically similar biomedical sentences",
    "icliniq": "Given a medical question from a patient, retrieve the doctor's answer to the question",
    "chemlit-qa": "Given a chemistry question, retrieve passages that answer the question",
    "relish": "Given a biomedical paper, retrieve papers that are relevant to it",
}


def instruction_for(dataset: str, override: str | None = None) -> str:
    """The instruction for a dataset name (a folder's basename, case-insensitive), else the default."""
    if override is not None:
        return override
    key = dataset.lower().strip().rstrip("/")
    for name, text in INSTRUCTIONS.items():
        if key == name or key.startswith(name + "-") or key.startswith(name + "_"):
            return text
    return DEFAULT_INSTRUCTION
