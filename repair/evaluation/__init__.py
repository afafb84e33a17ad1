"""Evaluation (scripts ``eval/``): score a retriever on every benchmark family the paper reports, and the run report.

- :mod:`.benchmarks` -- which benchmark a path holds and whether its files are there (before a model loads);
- :mod:`.instructions` -- the query instruction of each benchmark for instruction-following retrievers;
- :mod:`.evaluate` -- the task families (IR, QA, MeSH, RELISH, BIOSSES) and their metrics;
- :mod:`.cli` -- the one command line behind the ``eval_*.py`` scripts;
- :mod:`.beir_slice` -- small BEIR slices (the demo's, the quality study's subsets);
- :mod:`.report` -- the run report: only reads the files every stage wrote, nothing recomputed.

Reads benchmark folders and a model (+ adapter); writes ``eval.json`` per benchmark and the run's ``report.md`` /
``report.json`` / plots. Imports only the foundation (the report reads other stages' files, not their modules).
"""
