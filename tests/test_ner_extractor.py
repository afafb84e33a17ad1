"""Token-classification extractor: sentence batching, sub-token -> word mapping, BIO spans, long sentences."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from repair.diagnosis.concepts import TokenClassificationExtractor, bio_spans, split_sentences, vote

from helpers_diagnosis import build_controlled_ner, build_random_ner

# uncased MiniLM word-pieces: lithium | iron | phosphate | carbon ; LiFePO4 -> life ##po ##4
CONTROLLED = {"lithium": "B-matname", "iron": "I-matname", "phosphate": "I-matname",
              "life": "B-mf", "##po": "I-mf", "##4": "I-mf", "carbon": "B-matname"}


@pytest.fixture(scope="module")
def controlled_dir(tmp_path_factory):
    return build_controlled_ner(tmp_path_factory.mktemp("ner_controlled"), CONTROLLED)


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    return build_random_ner(tmp_path_factory.mktemp("ner_random"))


def test_vote_and_bio_rules():
    assert vote([2, 1, 1, 2]) == 2            # tie: first seen wins
    assert vote([0, 3, 4, 4]) == 4
    words = ["lithium", "iron", "phosphate", "and", "LiFePO4", "graphene", "oxide"]
    tags = ["B-matname", "I-matname", "I-matname", "O", "I-mf", "B-matname", "I-matname"]
    assert bio_spans(words, tags) == [("matname", "lithium iron phosphate"), ("mf", "LiFePO4"),
                                      ("matname", "graphene oxide")]
    assert bio_spans(words, tags, "word") == [("matname", "lithium"), ("matname", "iron"), ("matname", "phosphate"),
                                              ("mf", "LiFePO4"), ("matname", "graphene"), ("matname", "oxide")]
    # I after another type starts a new entity; B after B too
    assert bio_spans(["a1", "b1", "c1"], ["B-mf", "I-matname", "B-matname"]) == [
        ("mf", "a1"), ("matname", "b1"), ("matname", "c1")]


def test_controlled_model_values(controlled_dir):
    ext = TokenClassificationExtractor.load(str(controlled_dir), device="cpu", batch_size=3)
    texts = ["We coated lithium iron phosphate (LiFePO4) particles. Carbon was added.",
             "Nothing to see here.",
             "LiFePO4, LiFePO4 and lithium again; see https://example.org/lithium for carbon."]
    ann = ext.annotate(texts)
    assert ann == [{"matname": ["lithium iron phosphate", "Carbon"], "mf": ["LiFePO4"]},
                   {"matname": [], "mf": []},
                   {"matname": ["lithium", "carbon"], "mf": ["LiFePO4"]}]
    # original casing comes back although the tokenizer lower-cases; the URL's "lithium" is not read
    assert ext(texts) == [["lithium iron phosphate", "Carbon", "LiFePO4"], [], ["lithium", "carbon", "LiFePO4"]]
    words = TokenClassificationExtractor.load(str(controlled_dir), device="cpu", aggregation="word")
    assert words.annotate(texts[:1])[0]["matname"] == ["lithium", "iron", "phosphate", "Carbon"]
    only_mf = TokenClassificationExtractor.load(str(controlled_dir), device="cpu", types=["mf"])
    assert only_mf(texts) == [["LiFePO4"], [], ["LiFePO4"]]
    with pytest.raises(ValueError, match="not in the model's labels"):
        TokenClassificationExtractor.load(str(controlled_dir), device="cpu", types=["chemical"])


def test_long_sentences_are_cut_at_word_boundaries(controlled_dir):
    filler = " ".join(f"word{k}" for k in range(40))
    text = f"{filler} lithium iron phosphate {filler} LiFePO4 end"
    ext = TokenClassificationExtractor.load(str(controlled_dir), device="cpu", max_length=8, batch_size=4)
    sentences = split_sentences(text)
    pieces = ext._pieces(sentences)
    tok = ext.tokenizer
    assert len(pieces) > 10
    assert pieces[0][1] == 0 and pieces[-1][2] == len(sentences[0])
    assert all(a == b for (_, _, b), (_, a, _) in zip(pieces, pieces[1:]))        # contiguous, no word lost
    for s, a, e in pieces:
        n_tokens = len(tok(sentences[s][a:e], is_split_into_words=True, add_special_tokens=False)["input_ids"])
        assert n_tokens <= 6                                                       # 8 - [CLS] - [SEP]
    assert ext(["x " + text]) == [["lithium iron phosphate", "LiFePO4"]]


def _brute_force_tags(model, tokenizer, words):
    enc = tokenizer(words, is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        pred = model(**enc).logits[0].argmax(-1).tolist()
    per_word = {}
    for pos, w in enumerate(enc.word_ids(0)):
        if w is not None:
            per_word.setdefault(w, []).append(pred[pos])
    tags = []
    for w in range(len(words)):
        labs = per_word.get(w, [0])
        counts = Counter(labs)
        top = max(counts.values())
        tags.append(model.config.id2label[[lab for lab in labs if counts[lab] == top][0]])
    return tags


def test_batched_sentences_match_one_by_one(random_dir):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    ext = TokenClassificationExtractor.load(str(random_dir), device="cpu", batch_size=4, max_length=128)
    texts = ["Perovskite solar cells based on CH3NH3PbI3 reach high efficiency.",
             "We grew GaN nanowires. XRD confirmed the wurtzite phase of the (0001) facets.",
             "Short one.",
             "A much longer sentence about lithium iron phosphate cathodes, carbon coatings, solid electrolytes "
             "and Li7La3Zr2O12 garnets that keeps going for a while to force padding in the batch."]
    sentences = [s for t in texts for s in split_sentences(t)]
    batched = ext.tag_sentences(sentences)
    model = AutoModelForTokenClassification.from_pretrained(random_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(random_dir)
    expected = [_brute_force_tags(model, tokenizer, words) for words in sentences]
    assert batched == expected
    assert len({t for tags in batched for t in tags}) >= 3  # the random model really predicts varied labels
    one = TokenClassificationExtractor(ext.model, ext.tokenizer, batch_size=1)
    assert one.tag_sentences(sentences) == batched


def test_missing_model_gives_clear_error(tmp_path):
    with pytest.raises(OSError, match="pass a local folder"):
        TokenClassificationExtractor.load(str(tmp_path / "no_such_model"))
