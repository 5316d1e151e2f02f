"""The module the ``torchloom`` entry point names: hook implementations only."""

from torchloom.api import hookimpl


@hookimpl
def torchloom_passes():
    from torchloom_example.pow_to_mul import PowToMul
    return [PowToMul]
