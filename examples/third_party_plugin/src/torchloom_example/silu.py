"""``example.silu``: ``x * sigmoid(x)`` -> ``silu(x)``, a pass written as two functions.

The pattern is traced into ``%s = aten.sigmoid.default(%x); %m = aten.mul.Tensor(%x, %s)``
and matches wherever that DAG occurs (``sigmoid(x) * x`` too, inside fusion groups too),
forward and backward; a sigmoid still returned (saved for the backward) stays.
"""

import torch

from torchloom.api import pattern_pass

Silu = pattern_pass("example.silu", lambda x: x * torch.sigmoid(x),
                    lambda x: torch.nn.functional.silu(x), [torch.randn(8)],
                    doc="x * sigmoid(x) -> silu(x), one op where there were two.")
