"""torchloom-codegen-cpu: compiles a CPU fusion group's region to one C function."""

from torchloom_codegen_cpu.codegen import CpuCodegen

__all__ = ["CpuCodegen"]
