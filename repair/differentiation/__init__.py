"""Stage III, Differentiation (scripts ``differentiation/07``-``09`` and ``09b``): one model-aware hard negative per
verified query, and only consistent tuples kept.

- :mod:`.tuples` -- the (query, positive, candidates) tuples read from Stage II's expansion JSONL;
- :mod:`.embedding_dir` -- 07: the candidates embedded once with the current retriever, in resumable shards;
- :mod:`.hard_negatives` -- 08 (Eq. 6: pick the hardest candidate below the positive) and 09 (Eq. 7: keep the
  tuples whose positive is consistently ranked above their negative);
- :mod:`.causalneg` -- CausalNeg's counterfactual (LLM-written) and mined negatives (09b).

Reads the expansion JSONL (or 06b's confused tuples) and a retriever; writes ``embeddings/``, the hard-negatives
JSONL and ``final_train_data.bottom_{pp}pct.jsonl`` (``query``, ``pos_document``, ``hard_negatives``,
``hard_negative_scores``, ``d_neg``, ``negative_sources``). Imports only the foundation, with one exception written
in the import contract (``.importlinter``): CausalNeg mines its BM25 negatives with Stage II's local-corpus index.
"""
