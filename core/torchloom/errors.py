"""Exceptions a user can cause. Each message names the file, line, pass or plugin involved."""

from __future__ import annotations


class TorchloomError(Exception):
    """Base class of every error torchloom raises on purpose."""

    #: exit code of the CLI for this error: 2 means "the user's input was wrong"
    exit_code = 2


class ParseError(TorchloomError):
    """Malformed IR text; the message starts with ``line:column``."""

    def __init__(self, message: str, line: int, column: int, source: str | None = None):
        self.line, self.column = line, column
        where = f"{source}:" if source else ""
        super().__init__(f"{where}{line}:{column}: {message}")


class VerifyError(TorchloomError):
    """A graph broke an IR invariant. The message shows the offending node in printed IR."""


class NumericError(VerifyError):
    """A pass changed the values a graph computes (``verify = "numeric"``). ``inputs`` is
    the input set (tensors and scalars) on which the graphs before and after it differ."""

    def __init__(self, message: str, inputs=()):
        self.inputs = list(inputs)
        super().__init__(message)


class PipelineError(TorchloomError):
    """A pipeline file or pipeline option is wrong; the message names file and line."""


class PluginError(TorchloomError):
    """A plugin could not be loaded or registered something inconsistent."""


class PassError(TorchloomError):
    """A pass raised or left a broken graph; the graph from before the pass was restored."""

    exit_code = 1

    def __init__(self, message: str, pass_name: str, distribution: str | None,
                 reproducer: str | None = None):
        self.pass_name, self.distribution, self.reproducer = pass_name, distribution, reproducer
        super().__init__(message)


class WorkloadError(TorchloomError):
    """A workload file given to the CLI is missing ``workload()`` or failed to run."""


class CompiledRunError(TorchloomError):
    """A workload that runs eagerly failed when compiled with torchloom (not the user's
    input: exit code 1, like a failing pass)."""

    exit_code = 1


class UnsupportedError(TorchloomError):
    """The frontend or a codegen cannot handle something; callers fall back to eager."""
