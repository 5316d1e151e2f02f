"""torchloom-codegen-triton: compiles a fusion group's region to one Triton kernel."""

from torchloom_codegen_triton.codegen import TritonCodegen

__all__ = ["TritonCodegen"]
