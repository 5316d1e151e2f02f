"""torchloom: a fusion compiler for PyTorch graphs, built as a plugin framework.

Public API lives in :mod:`torchloom.api`; plugins import only from there.
"""

__version__ = "0.1.0"
