"""CausalNeg hard negatives (second source document, Sec. 3.2 and 4.1), the paper's baselines, and its diagnostics.

For each (q, d+) the pipeline writes one triplet line (SCHEMAS.md ``final_train_data`` schema) whose hard negatives
come from up to two places:

- **corpus negatives** (``negative_sources`` "mined"): BM25-mined (``bm25s`` through
  :class:`repair.expansion.sources.local_corpus.LocalCorpus`, positives excluded; the paper's 15 per query), uniformly random
  corpus documents (the "Random" baseline), or the input's own hard negatives (REPAIR's 08/09 output);
- **generated negatives** (``negative_sources`` "generated"), written by a generator of :mod:`repair.expansion.generation`
  (local HF model or OpenAI-compatible server), either
  - ``cot``: the three-stage CoT-guided counterfactual perturbation of Sec. 3.2 -- stage 1 decomposes *why* d+
    satisfies q into K falsifiable requirements (Eq. 2: relevance as a conjunction), stage 2 picks one
    perturbation per requirement (entity substitution, requirement drift, constraint violation), stage 3 writes
    one negative per perturbation in the corpus' style, given style references sampled from the corpus; or
  - ``vanilla``: a SyNeg-style single prompt (the paper's "vanilla generation" baseline, Sec. 2.1).

Every generated negative keeps a trace (method, requirement, perturbation type, chain position, style references)
in ``negative_traces``. Malformed generator outputs are retried, then counted; a weak model (SmolLM2-135M) mostly
produces such outputs and the pipeline survives it. Records are appended one at a time (resumable).

The modules, one idea each (import the one you need; this file imports none of them):

- :mod:`.prompts` -- the perturbation types and the three prompts (stage 1, stage 3, vanilla);
- :mod:`.parsing` -- tolerant parsing of generator outputs into requirements and clean documents;
- :mod:`.inputs` -- the (q, d+) items to give negatives to, and the corpus negatives (BM25, random, style refs);
- :mod:`.generate` -- stage 2 planning and the batched, retried generator calls of one chunk of items;
- :mod:`.pipeline` -- the paper's configurations (:data:`~.pipeline.CONFIGS`: random, mined, vanilla, cot,
  mixture = SyNeg's 15 mined + 3 vanilla, causalneg = 15 mined + 3 CoT trained with QEM) and the resumable run;
- :mod:`.diagnostics` -- the embedding-space measurements of Sec. 2.3 / 4.3 (Table 5) and their plots;
- :mod:`.dynamics` -- the training-time measurements of Sec. 2.4 / 4.3 (Fig. 3, Table 3): it reads a training run,
  so it is the one module here above the trainer (:mod:`repair.training.trainer`, imported lazily).

The two ``negative_sources`` values are defined once, in the file contract (:mod:`repair.data`), because every stage
that reads or writes triplets (08/09's differentiation, this package, the trainer's data and loss) must agree on
them; this file re-exports them and imports none of the package's modules.
"""

from repair.data import GENERATED, MINED, NEGATIVE_SOURCES

__all__ = ["GENERATED", "MINED", "NEGATIVE_SOURCES"]
