"""Hook implementations of the dedup plugin."""

from torchloom.api import hookimpl


@hookimpl
def torchloom_passes():
    from torchloom_dedup.kernels import DedupKernels
    from torchloom_dedup.regions import DedupRegions
    return [DedupKernels, DedupRegions]
