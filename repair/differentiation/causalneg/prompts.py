"""The prompts of CausalNeg's generator calls: the three perturbation types of stage 2 and the three prompt builders
(stage 1 decomposition, stage 3 constrained writing, and the vanilla SyNeg-style baseline).

Separate from parsing and generation because a prompt is a fixed text contract (its id is recorded in every trace):
changing a wording here changes every generated file, and nothing else belongs next to it.
"""

from __future__ import annotations

from typing import Sequence

from repair.text import clip_text

# Our own wording of the paper's App. C prompts (Step 2: information requirement decomposition with disruption
# strategies; Step 3: constrained generation in the corpus' style). The exact templates are not in our sources.
COT_DECOMPOSE_ID = "causalneg-decompose-v1"
COT_WRITE_ID = "causalneg-write-v1"
VANILLA_ID = "syneg-vanilla-v1"

PERTURBATIONS: dict[str, str] = {
    # Sec. 3.2, stage 2: the three canonical violations.
    "entity_substitution": "replace the entity this requirement is about with a related but different one (a "
                           "sibling protein, another drug, another cell type, disease or population)",
    "requirement_drift": "shift the document's focus to an adjacent but different question on the same topic (for "
                         "example the mechanism instead of the clinical effect, or a different outcome)",
    "constraint_violation": "break a specific condition of this requirement: a different time, place, dose, "
                            "quantity, population, or the opposite direction of the effect",
}
PERTURBATION_ALIASES = {
    "entity": "entity_substitution", "substitution": "entity_substitution", "entity substitution":
    "entity_substitution", "drift": "requirement_drift", "requirement drift": "requirement_drift",
    "topic drift": "requirement_drift", "constraint": "constraint_violation", "violation": "constraint_violation",
    "constraint violation": "constraint_violation",
}

DECOMPOSE_HEAD = (
    "You analyse why a document is relevant to a search query. Think about what the query asks for, then list "
    "the {k} information requirements that the document satisfies and that together make it relevant. Each "
    "requirement is one concrete, checkable condition, such as \"names the enzyme that cleaves X\" or \"reports "
    "the effect in adults over 65\". For each one, say how to violate it: entity_substitution, requirement_drift "
    "or constraint_violation."
)
DECOMPOSE_FORMAT = (
    "Answer with a numbered list, one requirement per line, each followed by its perturbation in brackets, for "
    "example:\n1. names the enzyme that cleaves the precursor protein [entity_substitution]\n"
    'JSON is accepted too: {{"requirements": [{{"requirement": "...", "perturbation": "..."}}]}}'
)
WRITE_HEAD = (
    "You write documents for a collection of scientific abstracts. Match the style, length and vocabulary of "
    "these documents from the collection:"
)
VANILLA_HEAD = (
    "Write a hard negative document for the search query below: a passage that looks relevant to the query (same "
    "topic, similar words) but does not answer it. Write it like the relevant document shown."
)


def build_decompose_prompt(query: str, positive: str, k: int, max_doc_chars: int = 1200) -> str:
    """Stage 1 (Sec. 3.2): decompose why d+ satisfies q into ``k`` falsifiable requirements, each with a
    suggested perturbation; asks for JSON (a numbered list is accepted too)."""
    return "\n".join([DECOMPOSE_HEAD.format(k=k), "", f"Query: {query}", f"Relevant document: "
                      f"{clip_text(positive, max_doc_chars)}", "", DECOMPOSE_FORMAT.format(), "", "Requirements:"])


def build_write_prompt(query: str, positive: str, requirement: str, perturbation: str, style_refs: Sequence[str],
                       target_words: int = 120, max_doc_chars: int = 1200, max_ref_chars: int = 500) -> str:
    """Stage 3 (Sec. 3.2): write one negative realising ``perturbation`` of ``requirement``, in the style of the
    corpus documents ``style_refs`` (they constrain the surface form: Table 2's stylistic failure modes)."""
    if perturbation not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {perturbation!r}; expected one of {sorted(PERTURBATIONS)}")
    lines = [WRITE_HEAD, ""]
    for j, ref in enumerate(style_refs, start=1):
        lines.append(f"Example {j}: {clip_text(ref, max_ref_chars)}")
    lines += ["", f"Search query: {query}", f"Relevant document: {clip_text(positive, max_doc_chars)}",
              f"The relevant document satisfies this requirement of the query: {requirement}",
              "", f"Write a new document on the same topic that does NOT satisfy this requirement. To do so, "
              f"{PERTURBATIONS[perturbation]}. Keep everything else close to the relevant document. Do not say "
              f"that anything was changed and do not mention the query. Write only the document, about "
              f"{target_words} words.", "", "Document:"]
    return "\n".join(lines)


def build_vanilla_prompt(query: str, positive: str, target_words: int = 120, max_doc_chars: int = 1200) -> str:
    """The SyNeg-style single prompt of the "vanilla generation" baseline (Sec. 2.1): no requirement model."""
    return "\n".join([VANILLA_HEAD, "", f"Query: {query}", f"Relevant document: {clip_text(positive, max_doc_chars)}",
                      "", f"Write only the document, about {target_words} words.", "", "Document:"])

