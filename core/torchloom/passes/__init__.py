"""Passes: the API, pipelines and the pass manager."""

from torchloom.passes.base import Pass, PassContext, PassResult

__all__ = ["Pass", "PassContext", "PassResult"]
