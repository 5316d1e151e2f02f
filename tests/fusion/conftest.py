"""Fixtures of the fusion tests."""

import pytest
from fusion_testing import plugin_registry


@pytest.fixture
def registry():
    return plugin_registry()
