"""Passes shipped with the core: dce, cse, canonicalize."""
