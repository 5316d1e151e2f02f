"""``example.algebra``: three rewrites in one pass, matched in one walk of the graph.

- ``double``: ``x + x`` -> ``x * 2.0`` (a name used twice: ``x + y`` is left alone);
- ``sqrt``: ``x ** 0.5`` -> ``sqrt(x)`` (a number in the pattern matches only itself:
  ``x ** 0.25`` is left alone);
- ``mean``: ``x.sum(-1) / n`` -> ``x.mean(-1)`` where ``n`` (a parameter: any number) is
  the size of the last dim, which ``check`` makes sure of.
"""

import torch

from torchloom.api import Match, Rewrite, pattern_pass


def _n_is_the_last_dim(match: Match) -> bool:
    return match.params["n"] == match.values["x"].type.shape[-1]


Algebra = pattern_pass("example.algebra", [
    Rewrite(lambda x: x + x, lambda x: x * 2.0, [torch.randn(8)], name="double"),
    Rewrite(lambda x: x ** 0.5, lambda x: torch.sqrt(x), [torch.rand(8)], name="sqrt"),
    Rewrite(lambda x, n: x.sum(-1) / n, lambda x, n: x.mean(-1), [torch.randn(4, 8), 8.0],
            params=["n"], check=_n_is_the_last_dim, name="mean"),
], doc="x + x -> x * 2.0, x ** 0.5 -> sqrt(x), x.sum(-1) / size -> x.mean(-1).")
