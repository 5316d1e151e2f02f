"""Reading the text files a user names (pipeline files, the parts of a reproducer).

Every way such a read can fail — a directory where a file was expected, a file that
cannot be opened, bytes that are not UTF-8 — is a :class:`~torchloom.errors.TorchloomError`
naming the file (and the line, for bad bytes) and saying what to do, never a bare
``OSError`` or ``UnicodeDecodeError``. A UTF-8 byte-order mark (as Windows editors
write) is accepted and dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchloom.errors import TorchloomError

BOM = "\ufeff"


def read_text_file(path: str | Path, what: str,
                   error: type[TorchloomError] = TorchloomError) -> str:
    """The text of ``path``, described as ``what`` ("a pipeline file") in messages."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path} is a directory, not {what}; give the path of {what}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}; check that the "
                    f"file exists and is readable") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(f"{path}:{line}:{column}: {what} must be UTF-8 text, but byte "
                    f"{data[exc.start]:#04x} is not UTF-8; is this the right file?") from None
    return text.removeprefix(BOM)


def read_json_file(path: str | Path, what: str,
                   error: type[TorchloomError] = TorchloomError) -> Any:
    """The JSON value in ``path``; malformed JSON is an error naming file, line and column."""
    text = read_text_file(path, what, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}:{exc.lineno}:{exc.colno}: {what} is not valid JSON: {exc.msg}; "
                    f"was it edited or cut short?") from None
    except RecursionError:
        raise error(f"{path}: {what} nests too deeply to read; was it edited?") from None
