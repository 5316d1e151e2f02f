"""Benchmark markers: every test here is ``timed`` (``./dev test`` runs them alone, after
tests/, on a quiet machine) unless it is marked ``counted``: it counts structure or calls
and times nothing, so it runs on the parallel workers beside tests/."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    here = config.rootpath / "benchmarks"
    for item in items:
        if item.path.is_relative_to(here) and "counted" not in item.keywords:
            item.add_marker(pytest.mark.timed)
