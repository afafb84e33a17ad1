"""The record of a driver run: ``OUT_DIR/settings.json`` holds the settings its finished steps were made with, so a
rerun under other result-changing settings is refused instead of silently skipping those steps and ignoring the
change (what :mod:`repair.driver.settings` resolves and validates, this records and compares).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit, urlunsplit

from repair.data import write_json
from repair.driver.settings_table import SETTINGS, SettingsError
from repair.expansion.server_pool import split_urls

RECORD_FILE = "settings.json"


def without_credentials(url: str) -> str:
    """A URL without user:password@ and query string, so a record or message never carries a secret."""
    parts = urlsplit(url)
    if not parts.scheme:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _absolute(value: str) -> str:
    return os.path.abspath(os.path.expanduser(value)) if value else value


def record_of(values: Mapping[str, str]) -> dict[str, object]:
    """The settings as recorded in ``settings.json``: numbers typed (1e-4 == 0.0001), paths absolute (a rerun
    from another folder is the same run), model names as given unless they are local folders."""
    out: dict[str, object] = {}
    for s in SETTINGS:
        value = values.get(s.name, "")
        if s.kind in ("int", "float") and value != "":
            number = float(value)
            out[s.name] = int(number) if s.kind == "int" else number
        elif s.kind in ("path", "file", "adapter") or (s.name == "OUT_DIR"):
            out[s.name] = _absolute(value)
        elif s.kind == "model" or s.name == "GEN_ADAPTER":
            out[s.name] = _absolute(value) if value and os.path.exists(os.path.expanduser(value)) else value
        elif s.name == "EVAL_DATA":
            specs = []
            for spec in value.split():
                head, sep, path = spec.rpartition(":")
                specs.append(f"{head}{sep}{_absolute(path)}")
            out[s.name] = " ".join(specs)
        elif s.name == "OPENAI_URL":
            out[s.name] = ",".join(without_credentials(u) for u in split_urls(value)) if value.strip() else value
        else:
            out[s.name] = value
    return out


def differences(recorded: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """Result-changing settings whose value differs from the record (settings missing from an older record are
    not compared)."""
    return [f"{s.name}: the run used {recorded[s.name]!r}, now {now[s.name]!r}"
            for s in SETTINGS if s.result and s.name in recorded and recorded[s.name] != now.get(s.name)]


def has_finished_steps(out_dir: Path) -> bool:
    return any((out_dir / ".state").glob("*.done"))


def check_and_record(out_dir: Path, values: Mapping[str, str], force: bool) -> None:
    """Refuse a rerun whose result-changing settings differ from those the run's finished steps were made with
    (:class:`SettingsError` naming each); otherwise (re)write ``settings.json``."""
    now = record_of(values)
    path = out_dir / RECORD_FILE
    if path.exists() and not force and has_finished_steps(out_dir):
        try:
            recorded = json.loads(path.read_text(encoding="utf-8")).get("settings", {})
        except (json.JSONDecodeError, AttributeError) as exc:
            raise SettingsError([f"{path}: unreadable settings record ({exc}); FORCE=1 rewrites it"]) from None
        diff = differences(recorded, now)
        if diff:
            raise SettingsError([f"{out_dir} holds a run made with other settings ({path}):"]
                                + [f"  {d}" for d in diff]
                                + ["Its finished steps would be skipped and the changes ignored. Rerun with the "
                                   "recorded settings, use a new OUT_DIR, or FORCE=1 to redo every step with the "
                                   "new ones."])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(path, {"written_by": "run_repair.sh", "settings": now})
