"""Testing helpers torchloom ships for its users: the perf-gate pytest plugin
(``perfgate``), generated aten programs of any size and graph shape for scaling and
property tests of passes (``programs``), a throwaway Redis server (``redis_server``)."""
