"""torchloom-dedup: ``dedup.kernels`` (alpha-equivalent fusion groups share one kernel)
and ``dedup.regions`` (repeated regions become calls of one shared subgraph)."""

__version__ = "0.1.0"
