"""``scalar_c``: a torchloom codegen written against ``torchloom.api`` alone (see
docs/writing-a-codegen.md): plain scalar C, no SIMD, no threads."""
