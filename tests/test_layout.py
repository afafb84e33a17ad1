"""The shape of the code base a newcomer relies on (issue 17): rooms of one idea each (every repair/ module under
500 lines, opening with a docstring that says its idea), and scripts that import the installed package instead of
editing sys.path."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_DIRS = ("diagnosis", "expansion", "differentiation", "training", "eval", "bench", "data")


def test_every_library_module_is_one_room_with_its_idea_on_the_door():
    modules = sorted((ROOT / "repair").rglob("*.py"))
    assert len(modules) > 30
    too_long = {str(m.relative_to(ROOT)): n for m in modules if (n := len(m.read_text().splitlines())) > 500}
    assert too_long == {}
    undocumented = [str(m.relative_to(ROOT)) for m in modules if not ast.get_docstring(ast.parse(m.read_text()))]
    assert undocumented == []


def test_no_script_edits_sys_path():
    offenders = [str(p.relative_to(ROOT)) for d in SCRIPT_DIRS for p in (ROOT / d).glob("*.py")
                 if "sys.path.insert" in p.read_text() or "sys.path.append" in p.read_text()]
    offenders += [str(p.relative_to(ROOT)) for p in (ROOT / "repair").rglob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []


# ------------------------------------------------------------------------------ issue 31: the stage layout
STAGES = ("diagnosis", "expansion", "differentiation", "training", "evaluation", "driver")


def test_repair_is_a_thin_foundation_over_one_subpackage_per_stage():
    top_modules = sorted(p.stem for p in (ROOT / "repair").glob("*.py") if p.name != "__init__.py")
    assert len(top_modules) <= 12, top_modules
    packages = sorted(p.name for p in (ROOT / "repair").iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(STAGES)
    # every stage package says on its door what the stage does and which files it reads and writes
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((ROOT / "repair" / stage / "__init__.py").read_text()))
        assert doc and ("Reads" in doc or "driver" in doc), stage


def _layout_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Layout"):]
    return section.split("```")[1]


def test_readme_layout_names_every_module_where_ls_finds_it():
    """The README's Layout tree can be checked against ``ls``: each stage entry lists exactly its folder's modules
    and subpackages, and the foundation lines list exactly the top-level modules."""
    block = _layout_block()
    lines = block.splitlines()
    entries: dict[str, set[str]] = {}
    current = None
    for line in lines:
        head = line[:29].strip()
        if line.startswith("  ") and head.endswith("/") and head[:-1] in STAGES:
            current = head[:-1]
            entries[current] = set()
        elif not line.startswith("  "):
            current = None
        if current:
            entries[current] |= set(re.findall(r"\b([a-z][a-z0-9_]*)(?:/|\b)", line[29:]))
    assert sorted(entries) == sorted(STAGES)
    for stage, named in entries.items():
        folder = ROOT / "repair" / stage
        present = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
        present |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
        assert present <= named, (stage, sorted(present - named))
    first_stage = next(i for i, line in enumerate(lines) if line.strip().split("/")[0] in STAGES)
    top_named = set(re.findall(r"\b([a-z_0-9]+)\.py\b", "\n".join(lines[:first_stage])))
    top_present = {p.stem for p in (ROOT / "repair").glob("*.py") if p.name != "__init__.py"}
    assert top_named == top_present


# --------------------------------------------------------------------- the import contract can fail (lint-imports)
def _lint_imports(package_root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contract on a copy of the package (its own import path, no cache)."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), str(ROOT / ".importlinter"), "--no-cache"], cwd=package_root,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("contract")
    shutil.copytree(ROOT / "repair", root / "repair", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_every_top_level_module_and_stage_is_in_the_layers_contract():
    contract = (ROOT / ".importlinter").read_text()
    layers = contract[contract.index("type = layers"):].split("[importlinter", 1)[0]
    listed = set(re.findall(r"repair\.([a-z_0-9]+)", layers))
    present = {p.stem for p in (ROOT / "repair").glob("*.py") if p.name != "__init__.py"} | set(STAGES)
    assert listed == present


def test_the_import_contract_holds_on_the_package(package_copy):
    result = _lint_imports(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, source, broken", [
    # a stage importing another stage's module: the independence contract
    ("repair/diagnosis/fixture_cross.py", "from repair.expansion import generation\n", "independent stages"),
    # the foundation importing a stage: the layers contract
    ("repair/data.py", "from repair.training import losses\n", "layers: driver > stages > foundation"),
    # two foundation siblings importing each other: a circle
    ("repair/tables.py", "from repair import metrics\n", "no cycles"),
])
def test_a_forbidden_import_breaks_the_contract(package_copy, tmp_path, module, source, broken):
    copy = tmp_path / "pkg"
    shutil.copytree(package_copy, copy)
    target = copy / module
    if module == "repair/tables.py":  # make the circle: tables -> metrics and metrics -> tables
        (copy / "repair" / "metrics.py").write_text((copy / "repair" / "metrics.py").read_text()
                                                    + "\nfrom repair import tables  # noqa\n")
    if target.exists():
        target.write_text(target.read_text() + "\n" + source)
    else:
        target.write_text('"""A fixture module with a forbidden import."""\n' + source)
    result = _lint_imports(copy)
    assert result.returncode == 1, result.stdout
    summary = " ".join(result.stdout.split())
    assert f"{broken} BROKEN" in summary, result.stdout
