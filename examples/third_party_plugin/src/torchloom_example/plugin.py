"""The module the ``torchloom`` entry point names: hook implementations only."""

from torchloom.api import hookimpl


@hookimpl
def torchloom_passes():
    from torchloom_example.algebra import Algebra
    from torchloom_example.pow_to_mul import PowToMul
    from torchloom_example.silu import Silu
    return [PowToMul, Silu, Algebra]
