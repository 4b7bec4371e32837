"""Suite-wide options and ordering.

- ``--device cpu|cuda|cuda:N`` (default ``cpu``): the device that device-agnostic tests run on; they
  take the ``device`` fixture and create their arrays with ``device=device``.
- Tests marked ``@pytest.mark.cuda`` are skipped on machines without a GPU (the CUDA simulator,
  STEPPER_CUDA_SIM=1, counts as one).
- With ``--device cuda`` only the tests that take the ``device`` fixture or carry the ``cuda``
  marker run: the rest are device-independent and ran in the CPU run.
- tests/test_cuda_codegen.py runs last, so it compiles to PTX the kernels that other tests define
  inside their functions too.
"""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="device for device-agnostic tests (those using the `device` fixture): cpu, cuda or cuda:N")


def pytest_configure(config):
    from compiler.runtime.device import get_device, require_cuda
    spec = config.getoption("--device")
    try:
        require_cuda(get_device(spec))
    except (ValueError, RuntimeError) as e:
        raise pytest.UsageError(f"--device {spec}: {e}") from None


@pytest.fixture(scope="session")
def device(request) -> str:
    """The device that device-agnostic tests create their arrays on (``--device``, default cpu).
    Session-scoped, so that module-scoped fixtures that launch kernels can take it too."""
    return request.config.getoption("--device")


def pytest_collection_modifyitems(config, items):
    from compiler.runtime.device import is_cuda_available
    if config.getoption("--device") != "cpu":
        keep = [item for item in items
                if "device" in getattr(item, "fixturenames", ()) or item.get_closest_marker("cuda") is not None]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    if not is_cuda_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
        for item in items:
            if item.get_closest_marker("cuda") is not None:
                item.add_marker(skip)
    last = [item for item in items if item.path.name == "test_cuda_codegen.py"]
    if last:
        items[:] = [item for item in items if item.path.name != "test_cuda_codegen.py"] + last
