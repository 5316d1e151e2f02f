"""Unified diffs of IR text: what a pass changed, for ``explain --dump`` and the HTML
report."""

from __future__ import annotations

import difflib


def ir_diff(before: str, after: str, before_name: str = "before",
            after_name: str = "after", context: int = 3) -> str:
    """The unified diff from ``before`` to ``after`` (empty when they are equal), as
    ``diff -u`` and ``git apply`` read it."""
    if before == after:
        return ""
    lines = difflib.unified_diff(before.splitlines(keepends=True),
                                 after.splitlines(keepends=True),
                                 fromfile=before_name, tofile=after_name, n=context)
    out = []
    for line in lines:  # the last line of a text without a final newline
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
