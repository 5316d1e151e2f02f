"""Where a pass lives, where its tests live: one rule for every installed pass, built-ins too.

A pass ``ns.kebab-name`` from plugin ``ns`` is the module
``plugins/<ns>/src/torchloom_<ns>/<snake_name>.py``, its unit tests are
``tests/<ns>/test_<snake_name>.py`` and its golden files ``tests/golden/<ns>/<snake_name>*.ir``
(checked by tests/golden/test_golden.py). A built-in pass ``name`` is
``core/torchloom/passes/builtin/<snake_name>.py`` with tests in
``tests/builtin/test_<snake_name>.py``. A newcomer finds a pass's code and tests from its name.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from torchloom.tools import load_plugins

ROOT = Path(__file__).resolve().parents[2]


def expected_places(name: str) -> tuple[Path, Path]:
    """(source module, unit-test module) a pass of this name must have."""
    ns, _, rest = name.rpartition(".")
    snake = rest.replace("-", "_")
    if not ns:
        return (ROOT / "core/torchloom/passes/builtin" / f"{snake}.py",
                ROOT / "tests/builtin" / f"test_{snake}.py")
    return (ROOT / "plugins" / ns / "src" / f"torchloom_{ns}" / f"{snake}.py",
            ROOT / "tests" / ns / f"test_{snake}.py")


def test_expected_places_follow_the_rule():
    src, test = expected_places("views.alias-to-copy")
    assert src.relative_to(ROOT).as_posix() == \
        "plugins/views/src/torchloom_views/alias_to_copy.py"
    assert test.relative_to(ROOT).as_posix() == "tests/views/test_alias_to_copy.py"
    src, test = expected_places("cse")
    assert src.relative_to(ROOT).as_posix() == "core/torchloom/passes/builtin/cse.py"
    assert test.relative_to(ROOT).as_posix() == "tests/builtin/test_cse.py"


def test_every_installed_pass_is_where_its_name_says_with_its_tests():
    plugins = load_plugins()
    assert len(plugins.passes) >= 14  # the built-ins and the fusion, views and dedup plugins
    wrong = []
    for name in sorted(plugins.passes):
        src, test = expected_places(name)
        actual = Path(inspect.getsourcefile(plugins.pass_class(name))).resolve()
        # compared from the package down, so a non-editable install passes too
        package_part = src.relative_to(ROOT).parts[-3 if src.parts[-2] == "builtin" else -2:]
        if actual.parts[-len(package_part):] != package_part or not src.is_file():
            wrong.append(f"{name}: defined in {actual}, expected {src.relative_to(ROOT)}")
        if not test.is_file():
            wrong.append(f"{name}: no unit tests at {test.relative_to(ROOT)}")
    assert wrong == []
