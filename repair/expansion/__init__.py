"""Stage II, Expansion (scripts ``expansion/05``, ``06_*``, ``06c`` and the rounds loop): new confusing queries
about the diagnosed concepts, verified in the literature.

- :mod:`.sources` -- grounding (PubChem, Materials Project) and literature sources (Semantic Scholar, Elsevier, a
  local corpus) over one HTTP core with retries, a cache and key pools;
- :mod:`.generation` -- the text generation backends (in-process ``transformers``, OpenAI-compatible servers) and
  the factory that picks one, shared by 05, 06c and CausalNeg's 09b; :mod:`.ct2_generation` the CTranslate2 engine
  (``GEN_BACKEND=ct2``) and :mod:`.local_llm` what the two local engines share;
- :mod:`.query_generation` -- 05's prompt, the generated queries' cleaning and the generation cache;
- :mod:`.concept_search` and :mod:`.verification` -- 06: search each query, keep the top hit as the new
  (query, positive) and the other hits as negative candidates;
- :mod:`.t0_style` -- 06c: rewrite a verified title into the form of T0's own queries;
- :mod:`.relevance_judge` -- 06d (``JUDGE=1``): an instruct model's P(yes) that a hit answers the query; re-picks the
  positive, drops unsupported tuples, keeps hits judged relevant out of the negative candidates;
- :mod:`.cli` -- the one command line behind the three 06 scripts.

Reads ``final_terms.bottom_{pp}pct.txt`` (Stage I's C_conf); writes the generated queries JSONL and the expansion
JSONL (per verified query: ``q_new``, ``d_pos``, ``negative_candidates``, the source and ids). Imports only the
foundation.
"""
