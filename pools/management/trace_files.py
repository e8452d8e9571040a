"""How the trace commands (`place`, `simulate`) read their JSON: from a path or standard input, with an
error that names the source and where the JSON broke."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from django.core.management.base import CommandError


def source_name(source: str) -> str:
    return "standard input" if source == "-" else source


def read_json(source: str, stdin: TextIO) -> Any:
    """The JSON document at `source` (a path, or - for `stdin`); else a CommandError saying why not."""
    if source == "-":
        text = stdin.read()
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as error:
            raise CommandError(f"Cannot read {source}: {error.strerror or error}.") from error
        except UnicodeDecodeError as error:
            raise CommandError(f"Cannot read {source}: it is not UTF-8 text.") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(
            f"{source_name(source)} is not valid JSON: {error.msg} at line {error.lineno}, "
            f"column {error.colno}."
        ) from error
