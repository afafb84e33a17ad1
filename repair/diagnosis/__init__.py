"""Stage I, Diagnosis (scripts ``diagnosis/01``-``04`` and ``differentiation/06b``): which training queries does the
retriever confuse, and with which concepts?

- :mod:`.margins` -- Eq. 1-2: each T0 query's score margin over its best non-positive, the percentile threshold,
  Q_conf, and the stage's provenance checks;
- :mod:`.concepts` -- concept extraction from documents (regex and NER paths);
- :mod:`.ccs` -- the concept confusion score (CCS) of the concepts in Q_conf's top negatives, and the merge;
- :mod:`.finch` -- FINCH clustering of confused queries (path B);
- :mod:`.stages` -- the four stages as functions (01 margins, 02 path A, 03 path B, 04 merge);
- :mod:`.confused_tuples` -- T0's own confused claims with the documents that beat their positive (06b).

Reads T0 (``.pt``, JSONL or a BEIR folder + split) and a retriever; writes, per iteration, into
``iter<k>/diagnosis/``: ``confused_train_queries.bottom_{pp}pct.cos.jsonl``, the all-queries margins file and its
meta JSON, ``cintra.bottom_{pp}pct.jsonl``, ``per_query_neg_concepts.bottom_{pp}pct.json``,
``pathB_finch_train.components.bottom_{pp}pct.json`` and ``final_terms.bottom_{pp}pct.{txt,json}`` (C_conf, the
concepts Stage II grounds). Imports only the foundation.
"""
