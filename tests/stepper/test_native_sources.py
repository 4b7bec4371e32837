"""The native driver's C++ (stepper/execute/fast: driver.h, loop.cpp, sweep.cpp) is source files
shipped with the package and built by the kernels' build code: its header is part of the cache key,
and every C++ file under stepper/ is package data."""
import shutil
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import stepper.execute.fast.native_loop as native_loop
from compiler.backends.cpu_build import build_cpu_library

REPO = Path(__file__).resolve().parents[2]


def test_every_cpp_file_under_stepper_is_package_data():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["stepper"]
    sources = sorted(p.relative_to(REPO / "stepper").as_posix() for p in (REPO / "stepper").rglob("*")
                     if p.suffix in (".h", ".cpp"))
    assert sources == ["execute/fast/driver.h", "execute/fast/loop.cpp", "execute/fast/sweep.cpp"]
    for source in sources:
        assert any(fnmatch(source, pattern) for pattern in patterns), f"{source} is not in package-data"


def test_the_driver_header_is_part_of_the_library_key(tmp_path):
    """A change to driver.h alone builds another library: a stale driver is never loaded."""
    copy = tmp_path / "fast"
    shutil.copytree(native_loop.SOURCES, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    source = (copy / "loop.cpp").read_text()
    before = build_cpu_library(source, "stepper_native_loop", include_dirs=[copy])
    (copy / "driver.h").write_text((copy / "driver.h").read_text() + "\n// changed\n")
    after = build_cpu_library(source, "stepper_native_loop", include_dirs=[copy])
    assert before != after and before.exists() and after.exists()

