"""Suite-wide options and markers.

- ``cuda``: the test needs a CUDA GPU; it is skipped (with the reason) without one.
- ``slow``: the test takes seconds (``./dev test --fast`` leaves it out).
- ``serial``: the test times things through pytest-benchmark (``perf_gate``, ``benchmark``)
  or runs pytest in-process (``pytester``); set on every test that uses one of those
  fixtures. pytest-benchmark turns itself off in xdist workers (and an inner pytest run
  there sees the worker's environment), and a timing wants a quiet machine: ``./dev test``
  runs these alone, after the rest of tests/ ran on parallel workers.
- ``--fuzz``: run the property tests with their large example counts (opt-in).
"""

from __future__ import annotations

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--fuzz", action="store_true", default=False,
                     help="run property tests with 10,000 examples each")


#: fixtures that make a test ``serial``
SERIAL_FIXTURES = frozenset({"perf_gate", "benchmark", "pytester", "testdir"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.serial)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _shared_libraries(tmp_path_factory):
    """The C libraries the tests of this process (one xdist worker) build, shared."""
    return tmp_path_factory.mktemp("torchloom-libraries")


@pytest.fixture(autouse=True)
def _private_kernel_cache(_shared_libraries, tmp_path_factory, monkeypatch):
    """Each test gets its own on-disk cache (graphs after the pipeline, kernel sources,
    autotuning records), so no test sees what another test (or an earlier run) compiled.
    Only the cpu codegen's libraries (``cpu/``: each keyed by its C source and the
    toolchain, as every process of a user shares them) are shared by the tests of one
    process: a kernel two tests generate is built once and the compiler probed once per
    process, not once per test (the probe alone is several compiler runs). The tests that
    count builds or probes, or damage, lock or remove libraries, give their compilers and
    codegens a ``cache_dir`` of their own (``tmp_path``)."""
    cache = tmp_path_factory.mktemp("torchloom-cache")
    (cache / "cpu").symlink_to(_shared_libraries, target_is_directory=True)
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(cache))


@pytest.fixture(scope="session")
def _dynamo_debug_backends():
    """pytester's in-process runs drop the modules each run imported; torch registers
    Dynamo's debug backends when ``torch._dynamo.backends.debugging`` is imported (lazily,
    by the first ``torch.compile``), so an inner run that imports it again after an earlier
    one dropped it fails with "duplicate name: eager". Imported once by this process before
    the first pytester's snapshot of ``sys.modules`` (a session fixture is set up before a
    test's own), it outlives every inner run."""
    import torch._dynamo.repro.after_dynamo  # noqa: F401


@pytest.fixture
def pytester(_dynamo_debug_backends, pytester):
    return pytester


@pytest.fixture
def fuzz(request) -> bool:
    return request.config.getoption("--fuzz")


@pytest.fixture(scope="session")
def eager_default(tmp_path_factory) -> str:
    """The shipped default pipeline with ``codegen = "eager"`` (the CPU reference codegen),
    as a file path: structure tests count groups without depending on the Triton plugin."""
    from pathlib import Path
    default = Path(__file__).resolve().parents[1] / "core" / "torchloom" / "pipelines" / "default.toml"
    lines = ['codegen = "eager"' if ln.startswith("codegen") else ln
             for ln in default.read_text().splitlines()]
    path = tmp_path_factory.mktemp("pipelines") / "default_eager.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)
