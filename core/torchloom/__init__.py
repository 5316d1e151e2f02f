"""torchloom: a fusion compiler for PyTorch graphs, built as a plugin framework.

Plugins import only :mod:`torchloom.api` (the plugin author's surface); tools built on
the compiler, for tests and scripts, are in :mod:`torchloom.tools`.
"""

__version__ = "0.1.0"
