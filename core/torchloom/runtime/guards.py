"""Guards on input metadata now live with the plan builder: :mod:`torchloom.codegen.guards`.
Re-exported here for callers that import them from the runtime."""

from torchloom.codegen.guards import describe_mismatch, guard_expressions, symbolic_guard

__all__ = ["describe_mismatch", "guard_expressions", "symbolic_guard"]
