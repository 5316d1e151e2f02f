"""Testing helpers torchloom ships for its users and its codegens: the perf-gate pytest plugin
(``perfgate``), generated aten programs of any size and graph shape for scaling and
property tests of passes (``programs``), a throwaway Redis server (``redis_server``), and
the reduction groups every codegen's tests compare with eager (``reductions``)."""
