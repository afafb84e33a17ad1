"""The shape of the code base a newcomer relies on (issue 17): rooms of one idea each (every repair/ module under
500 lines, opening with a docstring that says its idea), and scripts that import the installed package instead of
editing sys.path."""

from __future__ import annotations

import ast
from pathlib import Path

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
