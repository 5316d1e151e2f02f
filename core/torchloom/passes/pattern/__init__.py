"""Pattern passes: rewrites written as two Python functions, traced (by the frontend,
:mod:`torchloom.frontend.patterns`) into IR patterns and matched here over the DAG."""

from torchloom.passes.pattern.match import PatternIndex, same_attr
from torchloom.passes.pattern.rewrite import PatternPass
from torchloom.passes.pattern.rules import COMMUTATIVE, Match, ParamSite, Rule

__all__ = ["COMMUTATIVE", "Match", "ParamSite", "PatternIndex", "PatternPass", "Rule",
           "same_attr"]
