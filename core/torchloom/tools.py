"""Tools built on the compiler, for tests, benchmarks and scripts (not for plugins, which
import only :mod:`torchloom.api`): compile a graph or a workload, load plugins and
pipelines, count what a compiled graph launches.

```python
from torchloom.tools import Compiler, count_kernels, load_workload
fn, inputs = load_workload("examples/gelu_bookend.py")
```
"""

from torchloom.codegen.eager import EagerCodegen
from torchloom.codegen.plan import build_function
from torchloom.compiler import Compilation, Compiler
from torchloom.workloads import import_workload, load_workload
from torchloom.plugins.loader import load_plugins
from torchloom.plugins.pipelines import load_pipeline
from torchloom.report import count_kernels, fusion_groups
from torchloom.runtime.cache import KernelCache

__all__ = ["Compilation", "Compiler", "EagerCodegen", "KernelCache", "build_function",
           "count_kernels", "fusion_groups", "import_workload", "load_pipeline",
           "load_plugins", "load_workload"]
