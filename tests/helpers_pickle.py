"""A pickle that runs code when loaded: what a malicious ``*.bin`` weights file does (the refusal tests' payload)."""

from __future__ import annotations

from pathlib import Path


class WritesMarker:
    """Unpickling this runs ``exec`` on code that creates ``marker``; a test asserts the file never appears."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",)
