"""Testing helpers torchloom ships for its users (the perf-gate pytest plugin)."""
