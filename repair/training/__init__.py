"""Training (script ``training/10_train_lora.py``): LoRA (or full) InfoNCE fine-tuning of the retriever on T0 plus
the kept triplets, and the measurements that read a training run.

- :mod:`.config` -- the trainer's settings and the one count of optimizer steps;
- :mod:`.data` -- training examples from T0 and triplet files, and the layout of one batch;
- :mod:`.losses` -- InfoNCE (Eq. 8) and CausalNeg's query-view entropy regulariser (QEM);
- :mod:`.gradcache` -- gradient caching, so the paper's global batch fits one device;
- :mod:`.trainer` -- the loop: AdamW, warmup + decay, DDP with all-gathered negatives, checkpoints, resume;
- :mod:`.causalneg_dynamics` -- CausalNeg's training-time diagnostics (Sec. 2.4 / 4.3), read from a run.

Reads T0 and ``final_train_data*.jsonl``; writes the adapter (or full model) folder with ``train_log.jsonl`` and
the run's arguments. Imports only the foundation.
"""
