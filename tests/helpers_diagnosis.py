"""Builders for the diagnosis tests: tiny BERT token classifiers with MatDetector's 5-label config.

``build_controlled_ner`` makes a model whose prediction for a token depends only on that token and is chosen
by the test: positional and segment embeddings are zero, every encoder sub-layer adds zero to its residual
(so the hidden state stays LayerNorm(word embedding)), and word embedding rows are one-hot vectors read
by an identity classifier. Token t is tagged ``labels[t]`` (default O), whatever its context or padding.
"""

from __future__ import annotations

from pathlib import Path

import torch

MATDETECTOR_LABELS = {0: "O", 1: "B-matname", 2: "I-matname", 3: "B-mf", 4: "I-mf"}
LABEL_ID = {v: k for k, v in MATDETECTOR_LABELS.items()}


def _config(vocab_size: int, hidden: int, layers: int, heads: int):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=512,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      id2label=dict(MATDETECTOR_LABELS), label2id=dict(LABEL_ID))


def minilm_tokenizer():
    from transformers import AutoTokenizer

    from repair.models import minilm_folder

    return AutoTokenizer.from_pretrained(minilm_folder())


def build_controlled_ner(folder: Path, token_labels: dict[str, str]) -> Path:
    """Save a BertForTokenClassification that tags each listed word-piece with its label, all else O."""
    from transformers import BertForTokenClassification

    tok = minilm_tokenizer()
    model = BertForTokenClassification(_config(tok.vocab_size, hidden=8, layers=1, heads=2))
    with torch.no_grad():
        words = model.bert.embeddings.word_embeddings.weight
        words.zero_()
        words[:, 0] = 1.0
        for piece, label in token_labels.items():
            tid = tok.convert_tokens_to_ids(piece)
            assert tid != tok.unk_token_id, piece
            words[tid].zero_()
            words[tid, LABEL_ID[label]] = 1.0
        model.bert.embeddings.position_embeddings.weight.zero_()
        model.bert.embeddings.token_type_embeddings.weight.zero_()
        for layer in model.bert.encoder.layer:
            for dense in (layer.attention.output.dense, layer.output.dense):
                dense.weight.zero_()
                dense.bias.zero_()
        model.classifier.weight.zero_()
        model.classifier.bias.zero_()
        for lab in MATDETECTOR_LABELS:
            model.classifier.weight[lab, lab] = 1.0
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def build_random_ner(folder: Path, seed: int = 0) -> Path:
    """A random-weight tiny BERT token classifier (context-dependent predictions) with the real tokenizer."""
    from transformers import BertForTokenClassification

    tok = minilm_tokenizer()
    torch.manual_seed(seed)
    model = BertForTokenClassification(_config(tok.vocab_size, hidden=32, layers=2, heads=4))
    with torch.no_grad():  # larger classifier weights: varied argmax labels instead of near-uniform logits
        model.classifier.weight.normal_(0, 1.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
