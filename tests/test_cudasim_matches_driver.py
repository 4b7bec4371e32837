"""The simulator's fake driver answers the calls of the real one: the same names, the same parameters.

The first run on a real GPU (2026-11-26, H100, cuda-bindings 13) failed 29 tests on one call:
``cuGraphInstantiateWithFlags``, which cuda-bindings 13 no longer has (``cuGraphInstantiate`` takes
the flags since CUDA 12), while the simulator implemented it, so CI never saw the difference. These
checks need no GPU, only cuda-bindings installed (a core dependency), and run in the CPU suite.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from compiler.backends.cudasim import driver as fake

real = pytest.importorskip("cuda.bindings.driver")

ROOT = Path(__file__).resolve().parent.parent
FAKE_CALLS = sorted(n for n in dir(fake) if re.fullmatch(r"cu[A-Z]\w+", n) and callable(getattr(fake, n)))


def _real_parameters(name: str) -> int:
    """The number of parameters of a cuda-bindings call, from the first line of its docstring
    (``cuGraphInstantiate(hGraph, unsigned long long flags)``): its Cython functions have no signature."""
    first = (getattr(real, name).__doc__ or "").strip().splitlines()[0]
    inside = first[first.index("(") + 1:first.rindex(")")].strip()
    return len(inside.split(",")) if inside else 0


@pytest.mark.parametrize("name", FAKE_CALLS)
def test_every_call_the_simulator_fakes_exists_with_the_same_parameters(name):
    assert hasattr(real, name), f"cuda.bindings.driver has no {name}: the simulator fakes a call the GPU lacks"
    fake_parameters = len(inspect.signature(getattr(fake, name)).parameters)
    assert fake_parameters == _real_parameters(name), \
        f"{name}: the simulator takes {fake_parameters} argument(s), cuda.bindings.driver {_real_parameters(name)}"


def test_every_driver_call_in_the_sources_is_real_and_simulated():
    used = set()
    for path in [*ROOT.glob("compiler/**/*.py"), *ROOT.glob("stepper/**/*.py"), *ROOT.glob("benchmarks/*.py")]:
        if "cudasim" not in path.parts:
            used |= set(re.findall(r"\b(?:driver|_driver\(\))\.(cu[A-Z]\w+)", path.read_text()))
    assert used, "no driver calls found: the pattern above no longer matches how the sources call the driver"
    assert sorted(n for n in used if not hasattr(real, n)) == [], "calls that cuda.bindings.driver does not have"
    assert sorted(n for n in used if not hasattr(fake, n)) == [], "calls that the simulator does not fake"
