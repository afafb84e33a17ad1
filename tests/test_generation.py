"""Generation backends and the query prompt: the paper prompt text, query cleaning, a tiny random causal LM
through transformers (batched left-padded generation equals one-by-one, seeded sampling repeats, chat
template, n per prompt, a retriever LoRA adapter merged into the decoder) and an OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from repair.expansion.generation import HFGenerator, OpenAIGenerator
from repair.expansion.query_generation import build_prompt, clean_query, describe_attributes
from tests.helpers_generation import build_tiny_causal
from tests.helpers_sources import FakeServer, Reply, openai_route


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------------- prompt
def test_paper_prompt_text():
    attrs = {"aspirin": {"pubchem": {"formula": "C9H8O4", "molecular_weight": 180.16, "iupac_name":
                                     "2-acetyloxybenzoic acid", "synonyms": ["ASA", "Ecotrin"]}},
             "Fe2O3": {"materials_project": {"formula": "Fe2O3", "crystal_system": "Trigonal", "band_gap": 2.0,
                                             "density": 5.2}}}
    prompt = build_prompt(["aspirin", "Fe2O3", "graphene"], attrs)
    lines = prompt.split("\n")
    assert lines[0].startswith("You are an expert scientific researcher. Write one research query that is "
                               "inherently ambiguous or hard to resolve for standard retrievers.")
    assert lines[2:] == [
        "Concept 1: aspirin (Attributes: formula C9H8O4; molecular weight 180.16 g/mol; IUPAC name "
        "2-acetyloxybenzoic acid; synonyms ASA, Ecotrin)",
        "Concept 2: Fe2O3 (Attributes: formula Fe2O3; crystal system Trigonal; band gap 2 eV; density 5.2 g/cm^3)",
        "Concept 3: graphene (Attributes: none known)",
        "",
        "Query:"]
    assert build_prompt(["TiO2"], template="original").endswith("Term: TiO2\nQuery:")
    assert describe_attributes({}) == "none known"
    with pytest.raises(ValueError):
        build_prompt(["x"], template="nope")


@pytest.mark.parametrize("raw,expected", [
    ("Here is a research query:\n\n**Query:** How does strain tune the band gap of hematite?",
     ("How does strain tune the band gap of hematite?", "ok")),
    ("Sure!\n\"Silent guardians: which BCL-2 family member keeps leukemic cells alive?\"",
     ("Silent guardians: which BCL-2 family member keeps leukemic cells alive?", "ok")),
    ("Research question: Why do cells die without glutathione peroxidase? A study of ferroptosis follows.",
     ("Why do cells die without glutathione peroxidase?", "ok")),
    ("1. The hidden cost of squeezing carbon sheets\n2. another", ("The hidden cost of squeezing carbon sheets", "ok")),
    ("", (None, "empty")),
    ("   \n  ", (None, "empty")),
    ("Query:", (None, "empty")),
    ("Concept 1: aspirin (Attributes: none known)", (None, "echo")),
    ("Base it on the concepts below and their attributes.", (None, "echo")),
    ("Graphene mobility", (None, "too_short")),
    ("What can we do with this?", (None, "vague")),
    ("cells cells cells cells cells cells cells", (None, "repetitive")),
    ("12 34 56 78 90 == ++ -- 11", (None, "not_text")),
])
def test_clean_query(raw, expected):
    prompt = build_prompt(["aspirin"])
    assert clean_query(raw, prompt) == expected


# ---------------------------------------------------------------------------------------------- HF backend
@pytest.fixture(scope="module")
def tiny_causal_dir(tmp_path_factory) -> Path:
    return build_tiny_causal(tmp_path_factory.mktemp("tiny_causal"))


@pytest.fixture(scope="module")
def tiny_generator(tiny_causal_dir) -> HFGenerator:
    return HFGenerator(str(tiny_causal_dir), device="cpu", batch_size=3)


PROMPTS = ["Graphene", "A much longer prompt about the electron mobility of graphene under pressure, please",
           "TiO2 nanotubes", "Which protein does venetoclax inhibit in leukemia?"]


def test_batched_greedy_equals_one_by_one(tiny_generator):
    batched = tiny_generator.generate(PROMPTS, do_sample=False, max_new_tokens=12, repetition_penalty=1.0)
    tiny_generator.batch_size = 1
    try:
        single = [tiny_generator.generate([p], do_sample=False, max_new_tokens=12, repetition_penalty=1.0)[0]
                  for p in PROMPTS]
    finally:
        tiny_generator.batch_size = 3
    assert batched == single
    assert tiny_generator.tokenizer.padding_side == "left"


def test_seeded_sampling_repeats_and_n_groups(tiny_generator):
    a = tiny_generator.generate(PROMPTS, seed=7, max_new_tokens=10)
    b = tiny_generator.generate(PROMPTS, seed=7, max_new_tokens=10)
    c = tiny_generator.generate(PROMPTS, seed=8, max_new_tokens=10)
    assert a == b and a != c
    greedy = tiny_generator.generate(PROMPTS[:2], n=2, do_sample=False, max_new_tokens=6, repetition_penalty=1.0)
    assert len(greedy) == 4 and greedy[0] == greedy[1] and greedy[2] == greedy[3]


def test_chat_template_is_applied(tiny_causal_dir, tiny_generator):
    text = tiny_generator.format("hello there")
    assert "<|im_start|>user\nhello there<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    raw = HFGenerator(str(tiny_causal_dir), device="cpu", chat_template="off")
    assert raw.format("hello there") == "hello there"
    assert raw.format([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n")


def test_retriever_adapter_is_merged_into_the_decoder(tiny_causal_dir, tmp_path):
    """A LoRA adapter saved on the bare decoder (as the retriever's are) lands on the causal LM's layers."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_causal_dir)
    decoder = get_peft_model(base.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                    init_lora_weights=False))
    decoder.save_pretrained(tmp_path / "adapter")
    weights = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    a = weights["base_model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = weights["base_model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    expected = AutoModelForCausalLM.from_pretrained(tiny_causal_dir).model.layers[0].self_attn.q_proj.weight \
        + (b @ a) * (8 / 4)
    gen = HFGenerator(str(tiny_causal_dir), adapter=str(tmp_path / "adapter"), device="cpu")
    got = gen.model.model.layers[0].self_attn.q_proj.weight
    assert torch.allclose(got, expected, atol=1e-5)
    assert not any("lora" in name for name, _ in gen.model.named_parameters())


# ---------------------------------------------------------------------------------------------- OpenAI backend
def test_openai_generator_request_and_answers(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-OPENAI-777")

    def reply(messages, seed):
        return f"Query: what limits {messages[-1]['content'].split()[-1]} (seed {seed})?"

    with FakeServer(openai_route(reply, model="served-7b", key="sk-test-OPENAI-777")) as srv:
        gen = OpenAIGenerator(srv.url + "/v1", concurrency=2)
        assert gen.model_name == "served-7b"  # discovered through GET /v1/models
        out = gen.generate(["about graphene", [{"role": "user", "content": "about TiO2"}]], seed=10,
                           max_new_tokens=40, temperature=0.6, top_p=0.9, repetition_penalty=1.2)
        bodies = sorted((r.json for r in srv.paths("/v1/chat/completions")), key=lambda b: b["seed"])
        auth = {r.headers["authorization"] for r in srv.requests}
    assert out == ["Query: what limits graphene (seed 10)?", "Query: what limits TiO2 (seed 11)?"]
    assert bodies[0] == {"model": "served-7b", "messages": [{"role": "user", "content": "about graphene"}], "n": 1,
                         "seed": 10, "max_tokens": 40, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.2}
    assert auth == {"Bearer sk-test-OPENAI-777"}


def test_openai_generator_server_ignoring_n_and_errors(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    calls = []

    def route(req):
        if req.path.endswith("/models"):
            return Reply(200, {"data": [{"id": "m"}]})
        calls.append(req.json)
        return Reply(200, {"choices": [{"index": 0, "message": {"content": f"answer {req.json['seed']}"}}]})

    with FakeServer(route) as srv:
        gen = OpenAIGenerator(srv.url + "/v1", model="m", send_repetition_penalty=False,
                              extra_body={"repeat_penalty": 1.1})
        out = gen.generate(["p"], n=3, seed=5)
    assert out == ["answer 5", "answer 6", "answer 7"]
    assert "repetition_penalty" not in calls[0] and calls[0]["repeat_penalty"] == 1.1
    assert "authorization" not in srv.requests[0].headers
