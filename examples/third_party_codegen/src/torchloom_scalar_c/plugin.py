"""The module the ``torchloom`` entry point names: hook implementations only."""

from torchloom.api import hookimpl


@hookimpl
def torchloom_codegens():
    from torchloom.api import RendererCodegen
    from torchloom_scalar_c.renderer import ScalarC
    return [RendererCodegen(ScalarC())]
