"""The docs cite tests by path and name: every citation names a test that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def test_every_test_the_docs_cite_exists() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing, cited = [], 0
    for document in documents:
        for path, name in CITATION.findall(document.read_text()):
            cited += 1
            source = ROOT / path
            defined = source.exists() and re.search(
                rf"^(?:async )?def {name}\b", source.read_text(), re.MULTILINE
            )
            if not defined:
                missing.append(f"{document.name}: {path}::{name}")
    assert cited > 50
    assert missing == []
