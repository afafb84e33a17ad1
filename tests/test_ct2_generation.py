"""The CTranslate2 backend (issue 33) on a tiny random-weight Qwen2 with SmolLM2's real tokenizer: a float32
conversion gives transformers' greedy tokens; int8 repeats itself; the one setting picks it in every script; a
corrupt, unfinished or mismatching conversion is refused with one line; a killed conversion is never trusted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

from repair.expansion.ct2_generation import CT2Generator, RECORD, convert, converted_folder, source_sha256  # noqa: E402
from repair.expansion.generation import HFGenerator, add_generator_args, generator_from_args, make_generator  # noqa: E402
from repair.models import ModelError  # noqa: E402
from tests.helpers_generation import build_tiny_causal, save_tiny_qwen2  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["Graphene", "A much longer prompt about the electron mobility of graphene under pressure, please",
           "TiO2 nanotubes", "Which protein does venetoclax inhibit in leukemia?"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """Untied embeddings: the tied tiny model greedily repeats the prompt's last token (whitespace), this one
    writes distinct text, so equal outputs mean equal tokens."""
    return save_tiny_qwen2(tmp_path_factory.mktemp("ct2") / "tiny_causal", "Qwen2ForCausalLM",
                           tie_word_embeddings=False)


@pytest.fixture(scope="module")
def hf_gen(tiny_dir) -> HFGenerator:
    return HFGenerator(str(tiny_dir), device="cpu", batch_size=3)


@pytest.mark.parametrize("penalty", [1.0, 1.2])
def test_float32_conversion_gives_transformers_greedy_tokens(tiny_dir, hf_gen, penalty):
    ct2 = CT2Generator(str(tiny_dir), device="cpu", batch_size=3, quantization="float32", threads=1)
    kw = dict(n=1, max_new_tokens=12, repetition_penalty=penalty, do_sample=False)
    want = hf_gen.generate(PROMPTS, **kw)
    got = ct2.generate(PROMPTS, **kw)
    assert got == want
    assert len(set(want)) == len(PROMPTS) and all(len(w.split()) >= 5 for w in want)
    # batching and the shared static prefix change nothing: one prompt at a time gives the same tokens
    assert [ct2.generate([p], **kw)[0] for p in PROMPTS] == want


def test_repetition_penalty_counts_generated_tokens_only(tmp_path):
    """The one documented difference at float32: CTranslate2 penalises tokens it generated, transformers also the
    prompt's. The tied tiny model makes it visible: its prompt ends with a newline that transformers penalises
    away at the first step and CTranslate2 writes once more; after that both repeat the same word."""
    folder = build_tiny_causal(tmp_path / "tied")
    hf = HFGenerator(str(folder), device="cpu", batch_size=1)
    ct2 = CT2Generator(str(folder), device="cpu", batch_size=1, quantization="float32", threads=1)
    kw = dict(n=1, max_new_tokens=6, do_sample=False)
    assert ct2.generate(PROMPTS[:1], repetition_penalty=1.0, **kw) == hf.generate(PROMPTS[:1], repetition_penalty=1.0,
                                                                                   **kw)
    text = hf.format(PROMPTS[0])
    ids = hf.tokenizer(text, add_special_tokens=False)["input_ids"]
    import torch

    with torch.no_grad():
        hf_ids = hf.model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, repetition_penalty=1.5,
                                   pad_token_id=hf.tokenizer.pad_token_id)[0, len(ids):].tolist()
    ct2_ids = ct2.generator.generate_batch([hf.tokenizer.convert_ids_to_tokens(ids)], max_length=6,
                                           include_prompt_in_result=False, repetition_penalty=1.5,
                                           sampling_topk=1)[0].sequences_ids[0]
    assert ct2_ids[0] == ids[-1] != hf_ids[0]  # the prompt's last token again, which transformers penalised
    assert ct2_ids[1:] == hf_ids[:5]


def test_int8_repeats_and_stays_close(tiny_dir, hf_gen):
    """int8 weights change the logits, so its greedy text may differ from fp32's (on the 1.5B: docs/generators.md).
    What holds: a call repeats exactly, seeded sampling repeats per seed, n completions are grouped by prompt."""
    ct2 = CT2Generator(str(tiny_dir), device="cpu", batch_size=2, quantization="int8", threads=1)
    assert ct2.compute_type == "int8" and ct2.folder.name.startswith("tiny_causal.ct2-int8-")
    greedy = dict(n=1, max_new_tokens=10, do_sample=False)
    first = ct2.generate(PROMPTS, **greedy)
    assert ct2.generate(PROMPTS, **greedy) == first and all(first)
    sampled = ct2.generate(PROMPTS[:2], n=3, seed=7, max_new_tokens=10, temperature=1.0, top_p=1.0)
    assert len(sampled) == 6
    assert ct2.generate(PROMPTS[:2], n=3, seed=7, max_new_tokens=10, temperature=1.0, top_p=1.0) == sampled
    assert ct2.generate(PROMPTS[:2], n=3, seed=8, max_new_tokens=10, temperature=1.0, top_p=1.0) != sampled
    # issue 44: a seed past the engine's unsigned 32 bits (05 passes --seed x 100003 + round) is taken modulo 2**32,
    # not a TypeError from set_random_seed
    assert ct2.generate(PROMPTS[:2], n=3, seed=7 + 2**32, max_new_tokens=10, temperature=1.0, top_p=1.0) == sampled


def test_one_flag_picks_the_engine(tiny_dir):
    import argparse

    p = argparse.ArgumentParser()
    add_generator_args(p)
    gen = generator_from_args(p.parse_args(["--model", str(tiny_dir), "--gen_backend", "ct2", "--device", "cpu",
                                            "--ct2_quantization", "float32"]))
    assert isinstance(gen, CT2Generator) and gen.describe()["backend"] == "ct2"
    assert gen.compute_type == "float32"
    default = generator_from_args(p.parse_args(["--model", str(tiny_dir), "--device", "cpu"]))
    assert isinstance(default, HFGenerator)
    # the factory keeps its signature: hf ignores the engine-only arguments
    assert isinstance(make_generator("hf", model=str(tiny_dir), device="cpu", quantization="int8"), HFGenerator)


def test_corrupt_or_unfinished_conversion_is_refused(tiny_dir):
    folder = convert(tiny_dir, "float32")
    record = json.loads((folder / RECORD).read_text())
    assert record["source_sha256"] == source_sha256(tiny_dir) and "model.bin" in record["files"]
    weights = folder / "model.bin"
    data = bytearray(weights.read_bytes())
    try:
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
        with pytest.raises(ModelError, match=r"model\.bin: size or sha256 differs .* corrupt"):
            CT2Generator(str(tiny_dir), device="cpu", quantization="float32")
        (folder / RECORD).rename(folder / "moved.json")
        with pytest.raises(ModelError, match="no repair_ct2.json, so not a finished conversion"):
            convert(tiny_dir, "float32")
    finally:
        import shutil

        shutil.rmtree(folder)
    assert convert(tiny_dir, "float32") == folder  # converted again from scratch


def test_mismatching_gguf_sha_is_refused(tmp_path):
    folder = build_tiny_causal(tmp_path / "qwen-like")
    (folder / "repair_source.json").write_text(json.dumps({"alias": "qwen2.5-coder-0.5b", "sha256": "0" * 64}))
    with pytest.raises(ModelError, match=r"repair_source.json: field 'sha256' is 0{64}, but the qwen2.5-coder-0.5b "
                                         r"GGUF has sha256 1d96"):
        convert(folder, "int8")
    assert not list(tmp_path.glob("qwen-like.ct2-*"))


def test_script_refuses_a_corrupt_conversion_in_one_line(tmp_path):
    folder = build_tiny_causal(tmp_path / "tiny")
    target = convert(folder, "int8")
    (target / "model.bin").write_bytes(b"truncated")
    concepts = tmp_path / "concepts.txt"
    concepts.write_text("graphene\nTiO2\n")
    proc = subprocess.run([sys.executable, str(ROOT / "expansion/05_query_generation.py"), "--concept_txt",
                           str(concepts), "--out_jsonl", str(tmp_path / "out.jsonl"), "--num_queries", "2",
                           "--model", str(folder), "--device", "cpu", "--gen_backend", "ct2"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "model.bin: size or sha256 differs" in last
    assert "Traceback" not in proc.stderr


KILLED_CHILD = """
import sys, time
from pathlib import Path
from ctranslate2.converters import TransformersConverter
import repair.expansion.ct2_generation as m
real = TransformersConverter.convert
def convert_then_hang(self, output_dir, **kw):
    out = real(self, output_dir, **kw)          # the weights are on disk, the record and the rename are not
    Path(sys.argv[2]).write_text(output_dir)
    time.sleep(120)
    return out
TransformersConverter.convert = convert_then_hang
m.convert(sys.argv[1], "float32")
"""


def test_killed_conversion_leaves_nothing_trusted(tmp_path):
    folder = build_tiny_causal(tmp_path / "tiny")
    signal_file = tmp_path / "written"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(folder), str(signal_file)], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not signal_file.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
        assert signal_file.exists(), "the child never finished writing the weights"
        half = Path(signal_file.read_text())
        assert (half / "model.bin").is_file()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    target = converted_folder(folder, "float32", source_sha256(folder))
    assert not target.exists()  # the killed conversion is only a hidden .tmp folder
    assert half.parent.name.endswith(".tmp") and half.parent.name.startswith(".")
    assert convert(folder, "float32") == target and (target / RECORD).is_file()
    assert not half.parent.exists()  # the next conversion cleared the leftovers


def test_retriever_adapter_is_merged_before_conversion(tiny_dir, tmp_path):
    """GEN_ADAPTER=auto hands the generator the retriever's LoRA: the converted copy is the merged model (its own
    cache key), so ct2 float32 writes what HFGenerator with the same adapter writes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    lora = get_peft_model(base.model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    adapter = str(tmp_path / "adapter")
    kw = dict(n=1, max_new_tokens=10, repetition_penalty=1.0, do_sample=False)
    with_adapter = HFGenerator(str(tiny_dir), adapter=adapter, device="cpu", batch_size=4).generate(PROMPTS, **kw)
    ct2 = CT2Generator(str(tiny_dir), adapter=adapter, device="cpu", batch_size=4, quantization="float32", threads=1)
    assert ct2.generate(PROMPTS, **kw) == with_adapter
    plain = CT2Generator(str(tiny_dir), device="cpu", batch_size=4, quantization="float32", threads=1)
    assert plain.folder != ct2.folder and plain.generate(PROMPTS, **kw) != with_adapter


HELD_CHILD = """
import sys, time
from pathlib import Path
from ctranslate2.converters import TransformersConverter
import repair.expansion.ct2_generation as m
real = TransformersConverter.convert
def convert_then_wait(self, output_dir, **kw):
    out = real(self, output_dir, **kw)          # the weights are in this run's temporary folder, not yet renamed
    Path(sys.argv[2]).write_text(output_dir)
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
    return out
TransformersConverter.convert = convert_then_wait
print(m.convert(sys.argv[1], "float32"))
"""
SECOND_CHILD = """
import logging, sys
import repair.expansion.ct2_generation as m
logging.basicConfig(level=logging.INFO)
print(m.convert(sys.argv[1], "float32"))
"""


def test_two_conversions_of_one_model_at_once_both_finish_with_one_folder(tmp_path):
    """Issue 44: a conversion removed every ``.<target>.*.tmp`` folder before starting, so a second run converting
    the same model deleted the first one's work (which then failed at its rename). Now the second waits for the
    first and uses its folder: both succeed, one verified folder, no leftovers."""
    folder = build_tiny_causal(tmp_path / "tiny")
    written, go = tmp_path / "written", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-c", HELD_CHILD, str(folder), str(written), str(go)], cwd=ROOT,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        deadline = time.monotonic() + 120
        while not written.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert written.exists(), first.communicate()[1][-2000:]
        second_log = tmp_path / "second.log"
        with open(second_log, "w") as log:
            second = subprocess.Popen([sys.executable, "-c", SECOND_CHILD, str(folder)], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=log, text=True)
        # until the second run waits for the first (or, without a lock, has finished on its own)
        while (time.monotonic() < deadline + 60 and second.poll() is None
               and "waiting for" not in second_log.read_text()):
            time.sleep(0.1)
        go.write_text("")
        out1, err1 = first.communicate(timeout=120)
        out2, _ = second.communicate(timeout=120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
    target = converted_folder(folder, "float32", source_sha256(folder))
    assert first.returncode == 0, err1[-2000:]
    assert second.returncode == 0, second_log.read_text()[-2000:]
    assert out1.strip() == out2.strip() == str(target) and (target / RECORD).is_file()
    assert "waiting for another process converting" in second_log.read_text()
    assert not list(tmp_path.glob(".tiny.ct2-*.tmp")) and [p.name for p in tmp_path.glob("tiny.ct2-*")] == [target.name]
    assert convert(folder, "float32") == target  # verified against its record
