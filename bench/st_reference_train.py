#!/usr/bin/env python
"""The calibration peer: fine-tune all-MiniLM-L6-v2 on the SciFact train claims with sentence-transformers'
own trainer (MultipleNegativesRankingLoss, in-batch negatives), the configuration issue 9's independent
calibration describes: one positive per claim, scale 20 (= tau 0.05), batch 32, lr 2e-5, 2 epochs, warmup
10 %, max length 256. The saved folder evaluates with eval/eval_beir.py like any other model.

    python bench/st_reference_train.py --scifact ../shared/data/scifact --seed 1 --output_dir runs/st_ref_s1
"""

from __future__ import annotations

import argparse
import tempfile


from repair.data import load_seed
from repair.models import minilm_folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scifact", required=True, help="BEIR SciFact folder")
    p.add_argument("--output_dir", required=True, help="where the trained model is saved")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max_length", type=int, default=256)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--no_duplicates", action="store_true",
                   help="sentence-transformers' NO_DUPLICATES batch sampler (no identical texts in a batch)")
    args = p.parse_args()
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments, losses)
    from sentence_transformers.training_args import BatchSamplers

    seed = load_seed(args.scifact, split="train")
    model = SentenceTransformer(str(minilm_folder()), device="cpu")
    model.max_seq_length = args.max_length
    train = Dataset.from_dict({"anchor": seed.queries, "positive": seed.passages})
    loss = losses.MultipleNegativesRankingLoss(model, scale=20.0)
    with tempfile.TemporaryDirectory() as tmp:
        targs = SentenceTransformerTrainingArguments(
            output_dir=tmp, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr, warmup_ratio=0.1, weight_decay=0.01, seed=args.seed, data_seed=args.seed,
            save_strategy="no", report_to=[], logging_steps=10, use_cpu=True,
            batch_sampler=BatchSamplers.NO_DUPLICATES if args.no_duplicates else BatchSamplers.BATCH_SAMPLER)
        SentenceTransformerTrainer(model=model, args=targs, train_dataset=train, loss=loss).train()
    model.save(args.output_dir)
    print(f"saved {args.output_dir} ({len(seed)} pairs, seed {args.seed})")


if __name__ == "__main__":
    main()
