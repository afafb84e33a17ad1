"""The retriever contract: our vectors equal the REPAIR README's encode recipe, adapters round-trip, cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from repair.encoding import (DEFAULT_INSTRUCTION, EOS_FORMAT, PLAIN_FORMAT, Retriever, fill_template, last_token_pool,
                             mean_pool)
from repair.text import MAX_CHARS_PER_TOKEN, char_budget

TEXTS = [
    "Venetoclax is a selective BCL-2 inhibitor approved for chronic lymphocytic leukemia.",
    "BCL1 (cyclin D1) rearrangement t(11;14) is the hallmark of mantle cell lymphoma.",
    "TiO2",
    "Perovskite CH3NH3PbI3 films degrade under humidity; {braces} stay literal.",
    "A considerably longer passage about Fe2O3 nanoparticles, their synthesis by sol-gel routes, the "
    "annealing temperature, and the resulting band gap measured by UV-vis spectroscopy in several solvents.",
]


def readme_encoder(base: str, adapter: str | None):
    """The README example, re-implemented from its text: tokenizer from ADAPTER (else base), PeftModel over
    AutoModel, pad = EOS + left padding when there is no pad token, last_token_pool, normalize."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(adapter or base)
    model = AutoModel.from_pretrained(base, dtype=torch.float32)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model = model.eval()
    if tok.pad_token is None:
        tok.pad_token, tok.padding_side = tok.eos_token, "left"

    def pool(h, mask):
        if mask[:, -1].sum() == mask.shape[0]:
            return h[:, -1]
        return h[torch.arange(h.shape[0]), mask.sum(1) - 1]

    @torch.no_grad()
    def encode(texts, max_length=512):
        b = tok(texts, max_length=max_length - 1, truncation=True, padding=False,
                return_attention_mask=False, return_token_type_ids=False)
        b["input_ids"] = [ids + [tok.eos_token_id] for ids in b["input_ids"]]
        b = tok.pad(b, padding=True, return_attention_mask=True, return_tensors="pt")
        return F.normalize(pool(model(**b, use_cache=False).last_hidden_state, b["attention_mask"]), dim=-1)

    return encode, tok


def make_adapter(base_dir, out_dir, seed=1):
    """A LoRA adapter with random (non-zero) A and B so it really changes the vectors; saved with tokenizer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModel.from_pretrained(base_dir)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, cfg)
    peft_model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out_dir)
    return str(out_dir)


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_model_dir_nopad"])
@pytest.mark.parametrize("with_adapter", [False, True])
def test_vectors_equal_readme_recipe(fixture, with_adapter, request, tmp_path):
    base = str(request.getfixturevalue(fixture))
    adapter = make_adapter(base, tmp_path / "adapter") if with_adapter else None
    ref_encode, ref_tok = readme_encoder(base, adapter)
    expected_side = "right" if fixture == "tiny_model_dir" else "left"
    assert ref_tok.padding_side == expected_side

    ours = Retriever.load(base, adapter, device="cpu", max_length=32, batch_size=2)
    assert ours.padding_side == expected_side
    queries = [f"{DEFAULT_INSTRUCTION}\nQuery: {t}" for t in TEXTS]
    passages = [f"Represent this passage.\nPassage: {t}" for t in TEXTS]
    # max_length 32 truncates the long text: the EOS slot is reserved before truncation in both
    np.testing.assert_allclose(ours.encode_queries(TEXTS).numpy(), ref_encode(queries, 32).numpy(), atol=1e-5)
    np.testing.assert_allclose(ours.encode_passages(TEXTS).numpy(), ref_encode(passages, 32).numpy(), atol=1e-5)


def test_adapter_changes_vectors(tiny_model_dir, tmp_path):
    adapter = make_adapter(str(tiny_model_dir), tmp_path / "a")
    plain = Retriever.load(str(tiny_model_dir), device="cpu").encode_passages(TEXTS[:2])
    adapted = Retriever.load(str(tiny_model_dir), adapter, device="cpu").encode_passages(TEXTS[:2])
    assert (plain - adapted).abs().max() > 1e-3


def test_one_door_takes_an_adapter_folder_as_the_model_and_loads_trainable(tiny_model_dir, tmp_path):
    """``Retriever.load`` is the one door (every script and the trainer): an adapter folder given as the model loads
    on the base its adapter_config.json names, the same vectors and cache key as base + adapter; ``trainable=True``
    is the same weights with only the LoRA weights requiring grad, in train mode and without an embedding cache."""
    import json

    from repair.models import ModelError

    base = str(tiny_model_dir)
    adapter = make_adapter(base, tmp_path / "adapter")
    explicit = Retriever.load(base, adapter, device="cpu")
    as_model = Retriever.load(adapter, device="cpu", cache_dir=tmp_path / "cache")
    assert (as_model.spec.name, as_model.spec.adapter, as_model.name) == (base, adapter, base)
    assert as_model.fingerprint() == explicit.fingerprint()
    expected = explicit.encode_passages(TEXTS[:3])
    torch.testing.assert_close(as_model.encode_passages(TEXTS[:3]), expected, atol=1e-6, rtol=0)

    trainable = Retriever.load(base, adapter, device="cpu", trainable=True)
    grads = [n for n, p in trainable.model.named_parameters() if p.requires_grad]
    assert grads and all("lora_" in n for n in grads) and trainable.model.training and trainable.cache is None
    torch.testing.assert_close(trainable.encode_passages(TEXTS[:3]), expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="embedding cache"):
        Retriever.load(base, adapter, device="cpu", trainable=True, cache_dir=tmp_path / "cache")

    # model = an adapter folder + adapter = a later adapter on the same base (the driver after training from an
    # adapter given as MODEL): base + the later adapter, not a stack of both
    later = make_adapter(base, tmp_path / "later", seed=2)
    pair = Retriever.load(adapter, later, device="cpu")
    assert (pair.spec.path, pair.spec.adapter) == (base, later)
    torch.testing.assert_close(pair.encode_passages(TEXTS[:3]),
                               Retriever.load(base, later, device="cpu").encode_passages(TEXTS[:3]), atol=1e-6, rtol=0)
    assert (pair.encode_passages(TEXTS[:3]) - expected).abs().max() > 1e-3
    foreign = make_adapter(base, tmp_path / "foreign", seed=3)
    foreign_cfg = tmp_path / "foreign" / "adapter_config.json"
    foreign_cfg.write_text(json.dumps({**json.loads(foreign_cfg.read_text()),
                                       "base_model_name_or_path": str(tmp_path / "other_base")}))
    with pytest.raises(ModelError, match="trained on .*other_base.*pass --model"):
        Retriever.load(adapter, foreign, device="cpu")

    config = tmp_path / "adapter" / "adapter_config.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items()
                                  if k != "base_model_name_or_path"}))
    with pytest.raises(ModelError, match=r"adapter_config.json: field 'base_model_name_or_path' is missing"):
        Retriever.load(adapter, device="cpu")


def test_tokenize_reserves_eos_slot(tiny_model_dir):
    r = Retriever.load(str(tiny_model_dir), device="cpu", max_length=8)
    ids = r.tokenize(["one two three four five six seven eight nine ten eleven", "hi"])
    assert len(ids[0]) == 8 and ids[0][-1] == r.tokenizer.eos_token_id
    assert ids[1][-1] == r.tokenizer.eos_token_id and len(ids[1]) == len(r.tokenizer("hi")["input_ids"]) + 1


def test_pooling_helpers_left_and_right():
    h = torch.arange(2 * 4 * 1, dtype=torch.float32).view(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    assert last_token_pool(h, right).flatten().tolist() == [1.0, 6.0]
    assert last_token_pool(h, left).flatten().tolist() == [3.0, 7.0]
    assert mean_pool(h, right).flatten().tolist() == [0.5, 5.0]


def test_formats_fill_one_pass():
    assert fill_template(EOS_FORMAT.query, "x {text} y", "Find it") == "Find it\nQuery: x {text} y"
    assert fill_template(EOS_FORMAT.passage, "abc") == "Represent this passage.\nPassage: abc"
    assert fill_template(PLAIN_FORMAT.query, "abc", "ignored") == "abc"


def test_order_restored_and_duplicates(tiny_model_dir):
    r = Retriever.load(str(tiny_model_dir), device="cpu", batch_size=2)
    texts = [TEXTS[4], TEXTS[2], TEXTS[4], TEXTS[0]]
    both = r.encode_passages(texts)
    singles = torch.cat([r.encode_passages([t], use_cache=False) for t in texts])
    np.testing.assert_allclose(both.numpy(), singles.numpy(), atol=1e-5)
    assert torch.equal(both[0], both[2])
    norms = both.norm(dim=1)
    np.testing.assert_allclose(norms.numpy(), np.ones(4), atol=1e-5)


class ForwardCounter:
    def __init__(self, module):
        self.calls = 0
        module.register_forward_hook(self)

    def __call__(self, *args):
        self.calls += 1


def test_cache_reuse_and_invalidation(tiny_model_dir, tmp_path):
    cache = tmp_path / "cache"
    first = Retriever.load(str(tiny_model_dir), device="cpu", cache_dir=cache, batch_size=2)
    counter = ForwardCounter(first.model)
    v1 = first.encode_passages(TEXTS)
    assert counter.calls == 3  # 5 texts in batches of 2
    # a new process-level object on the same model: no forward pass at all
    again = Retriever.load(str(tiny_model_dir), device="cpu", cache_dir=cache, batch_size=2)
    counter2 = ForwardCounter(again.model)
    v2 = again.encode_passages(TEXTS)
    assert counter2.calls == 0
    assert torch.equal(v1, v2)
    # queries are a different format: they are encoded, not served from passage vectors
    again.encode_queries(TEXTS[:1])
    assert counter2.calls == 1
    # a changed adapter never reuses old vectors
    adapter = make_adapter(str(tiny_model_dir), tmp_path / "adapter")
    adapted = Retriever.load(str(tiny_model_dir), adapter, device="cpu", cache_dir=cache, batch_size=2)
    counter3 = ForwardCounter(adapted.model)
    v3 = adapted.encode_passages(TEXTS)
    assert counter3.calls == 3
    assert (v3 - v1).abs().max() > 1e-3
    # the same adapter folder re-saved with different weights gets a new fingerprint
    fp_before = adapted.fingerprint()
    make_adapter(str(tiny_model_dir), tmp_path / "adapter", seed=7)
    assert Retriever.load(str(tiny_model_dir), adapter, device="cpu", cache_dir=cache).fingerprint() != fp_before
    # other settings that change vectors change the fingerprint too
    assert Retriever.load(str(tiny_model_dir), device="cpu", max_length=64).fingerprint() != first.fingerprint()


def test_interrupted_cache_keeps_finished_shards(tiny_model_dir, tmp_path):
    cache = tmp_path / "cache"
    r = Retriever.load(str(tiny_model_dir), device="cpu", cache_dir=cache, batch_size=1)
    gen = r._encode_uncached(r.format(TEXTS, "passage"), [b"k%d" % i for i in range(5)], 1, None, False, "x")
    next(gen)
    gen.close()  # simulated interruption: nothing half-written
    assert not list((cache / r.fingerprint()).glob("*.tmp.npy"))
    r.encode_passages(TEXTS[:2], flush_every=1)
    shards = list((cache / r.fingerprint()).glob("shard-*.keys.npy"))
    assert len(shards) == 2


def test_linked_cache_serves_the_source_vectors_and_keeps_its_own_writes_apart(tmp_path):
    """link_cache: a second run's cache reads every finished shard of the first (per fingerprint, with its meta),
    skips a shard whose vectors are missing (an interrupted put), links nothing twice, and writes only to itself."""
    from repair.encoding import EmbeddingCache, link_cache, text_key

    keys = [text_key(t) for t in ("a", "b", "c")]
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    EmbeddingCache(tmp_path / "src", "fp1", meta={"model": "m1"}).put(keys[:2], vectors[:2])
    EmbeddingCache(tmp_path / "src", "fp2").put(keys[2:], vectors[2:])
    np.save(tmp_path / "src" / "fp1" / "shard-orphan.keys.npy", np.array([text_key("d")], dtype="S40"))
    assert link_cache(tmp_path / "src", tmp_path / "dst") == 2
    assert link_cache(tmp_path / "src", tmp_path / "dst") == 0
    first, second = EmbeddingCache(tmp_path / "dst", "fp1"), EmbeddingCache(tmp_path / "dst", "fp2")
    assert len(first) == 2 and np.array_equal(first.get(keys[:2]), vectors[:2])
    assert np.array_equal(second.get(keys[2:]), vectors[2:]) and text_key("d") not in first
    assert (tmp_path / "dst" / "fp1" / "meta.json").read_text() == (tmp_path / "src" / "fp1" / "meta.json").read_text()
    first.put([text_key("own")], np.ones((1, 4), dtype=np.float32))
    assert len(EmbeddingCache(tmp_path / "src", "fp1")) == 2


def test_mean_pooling_matches_sentence_transformers_recipe(tmp_path):
    """The `mean` profile equals the masked-mean recipe on a tiny BERT with a real WordPiece tokenizer."""
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    from repair.models import minilm_folder

    tok = AutoTokenizer.from_pretrained(minilm_folder())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    r = Retriever.load(str(tmp_path), device="cpu", batch_size=2)
    assert r.pooling == "mean" and r.text_format == PLAIN_FORMAT
    model = AutoModel.from_pretrained(tmp_path).eval()
    enc = tok(TEXTS, padding=True, truncation=True, max_length=512, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    expected = F.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    np.testing.assert_allclose(r.encode_queries(TEXTS, instruction="ignored").numpy(), expected.numpy(), atol=1e-5)


class RecordingTokenizer:
    """The real tokenizer, recording the longest string it is handed (observes, replaces nothing)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.longest = 0

    def __call__(self, texts, *args, **kwargs):
        self.longest = max([self.longest, *(len(t) for t in texts)])
        return self._tokenizer(texts, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def test_huge_text_is_cut_to_the_char_budget_before_tokenising(tiny_model_dir):
    """One 50 MB line cost 6 GB and 136 s in 01: the tokenizer read it all before truncating to max_length."""
    r = Retriever.load(str(tiny_model_dir), device="cpu", max_length=32)
    r.tokenizer = RecordingTokenizer(r.tokenizer)
    budget = char_budget(32)
    assert budget == 32 * MAX_CHARS_PER_TOKEN == 3200
    huge = ("Fe2O3 nanoparticles were annealed at 500 C in air. " * 100_000)[:5_000_000]
    vec = r.encode_passages([huge], use_cache=False)
    assert r.tokenizer.longest == budget  # the formatted passage, cut to the budget before the tokenizer saw it
    prefix = len(r.format([""], "passage")[0])
    head = r.encode_passages([huge[:budget - prefix]], use_cache=False)
    assert torch.equal(vec, head)
    # ordinary prose: the cut changes no id (max_length tokens need far fewer than the budget's characters)
    formatted = r.format([huge[:3 * budget]], "passage")[0]
    uncut = r.tokenizer._tokenizer([formatted], max_length=31, truncation=True)["input_ids"][0]
    assert r.tokenize([formatted])[0] == uncut + [r.tokenizer.eos_token_id]


def test_ner_extractor_reads_a_text_up_to_its_char_budget(tmp_path):
    """The token-classification extractor cuts each text to char_budget(max_text_tokens) before splitting it."""
    from helpers_diagnosis import build_controlled_ner

    from repair.diagnosis.concepts import TokenClassificationExtractor

    folder = build_controlled_ner(tmp_path / "ner", {"carbon": "B-matname", "lithium": "B-matname"})
    ext = TokenClassificationExtractor.load(str(folder), device="cpu", max_text_tokens=8)
    text = "Carbon was added. " + "plain words here. " * 60 + "Lithium came last."
    assert len("Carbon was added. " + "plain words here. " * 60) > char_budget(8) == 800
    assert ext([text]) == [["Carbon"]] == ext([text[:800]])
    assert ext.describe()["max_text_tokens"] == 8
    assert TokenClassificationExtractor.load(str(folder), device="cpu")([text]) == [["Carbon", "Lithium"]]



def test_a_50mb_text_costs_a_bounded_time_and_memory_and_encodes_as_its_capped_prefix(tiny_model_dir):
    """Issue 32: one 50 MB text in 01's or 07's input. The tokenizer sees char_budget(max_length) characters of it,
    never the whole text; Python holds the text and one formatted copy, nothing per token; the vector is the one of
    its capped prefix."""
    import time
    import tracemalloc

    r = Retriever.load(str(tiny_model_dir), device="cpu", max_length=64)
    r.tokenizer = RecordingTokenizer(r.tokenizer)
    huge = ("Fe2O3 nanoparticles were annealed at 500 C in air. " * 1_000_000)[:50_000_000]
    tracemalloc.start()
    started = time.perf_counter()
    vec = r.encode_passages([huge], use_cache=False)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert r.tokenizer.longest == char_budget(64) == 6400
    assert peak < 2.5 * len(huge), peak  # the formatted copy (50 MB) and the cut, not tokens of 50 MB
    assert seconds < 10, seconds  # uncut, the tokenizer alone took 136 s and 6 GB on one 50 MB line
    prefix = len(r.format([""], "passage")[0])
    assert torch.equal(vec, r.encode_passages([huge[:char_budget(64) - prefix]], use_cache=False))


@pytest.mark.parametrize("script", ["diagnosis/01_diagnosis_margin.py", "differentiation/07_embed_candidates.py"])
def test_the_char_cap_is_stated_in_the_help_of_the_encoding_scripts(script):
    """Issue 32: 01's and 07's --help say that a text is cut to max_length x MAX_CHARS_PER_TOKEN characters."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / script), "--help"], capture_output=True, text=True, cwd=root,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    help_text = " ".join(proc.stdout.split())
    assert (f"each text is first cut to --max_length x {MAX_CHARS_PER_TOKEN} characters before tokenising, so "
            f"tokenising one huge text (a 50 MB line) costs no more than that") in help_text
