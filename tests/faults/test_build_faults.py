"""Compiler and kernel-cache faults end as a BuildError naming the cache and the setting that moves
it, or as a silent rebuild: never a hang, a raw OSError or a signal. Loading a damaged library can
kill a process, so those checks run in a child."""
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from compiler.backends import BuildError, build_cpu_library, set_build_timeout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = 'extern "C" int stepper_answer(void) { return 42; }\n'


def fake_compiler(tmp_path, body):
    """A $CXX that answers --version and the feature probes at once, then runs `body` (sh) on builds."""
    script = tmp_path / "fake-cxx"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *--version*) echo "fake-cxx 1.0"; exit 0;; *probe*) exit 1;; esac
        {body}
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_hanging_compiler_is_killed_after_the_build_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, "sleep 120"))
    set_build_timeout(1)
    try:
        with pytest.raises(BuildError, match=r"did not finish within 1 s and was killed; raise the limit with "
                                             r"compiler.backends.set_build_timeout\(seconds\)"):
            build_cpu_library(SOURCE, "hang", cache_dir=tmp_path / "cache")
    finally:
        set_build_timeout(300)
    with pytest.raises(ValueError, match="positive number of seconds"):
        set_build_timeout(0)


def test_a_slow_build_says_once_what_it_builds_and_where(tmp_path, monkeypatch, caplog):
    import compiler.backends.cpu_build as cpu_build
    real = cpu_build.find_cxx()[0]
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, f'sleep 1.5; exec {real} "$@"'))
    monkeypatch.setattr(cpu_build, "BUILD_NOTICE_SECONDS", 0.5)
    with caplog.at_level("WARNING", logger="compiler.backends.cpu_build"):
        lib = build_cpu_library(SOURCE, "slow", cache_dir=tmp_path / "cache", what="kernel module 'slow' (3 kernels)")
    notices = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    assert notices == [f"compiling kernel module 'slow' (3 kernels) into the kernel cache {tmp_path / 'cache'}: "
                       f"still running after 0.5 s (once per change of the source; later runs load it from the "
                       f"cache; killed after {cpu_build._build_timeout[0]:g} s, "
                       f"compiler.backends.set_build_timeout(seconds))"]
    assert lib.exists()
    caplog.clear()
    with caplog.at_level("WARNING", logger="compiler.backends.cpu_build"):
        build_cpu_library(SOURCE, "slow", cache_dir=tmp_path / "cache")         # a cache hit: silent
    assert caplog.records == []


def test_a_compiler_that_writes_nothing_is_a_build_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", fake_compiler(tmp_path, "exit 0"))
    with pytest.raises(BuildError, match=r"exited 0 but wrote no library .*check the compiler"):
        build_cpu_library(SOURCE, "nothing", cache_dir=tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").glob("*.so")] == []


def test_an_unusable_cache_directory_names_it_and_how_to_move_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(BuildError) as e:
        build_cpu_library(SOURCE, "nocache", cache_dir=blocker / "cache")
    assert str(e.value).startswith(f"the kernel cache {blocker / 'cache'} is not usable (")
    assert "compiler.backends.set_cache_dir(path)" in str(e.value)


DAMAGE_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from compiler.backends import build_cpu_library, load_cpu_library
    cache, how = Path(sys.argv[1]), sys.argv[2]
    source = 'extern "C" int stepper_answer(void) { return 42; }\\n'
    lib = build_cpu_library(source, "damaged", cache_dir=cache)
    data = lib.read_bytes()
    lib.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"not a library" * 100}[how])
    again = build_cpu_library(source, "damaged", cache_dir=cache)      # a new process would see the same
    print(again == lib, again.read_bytes() == data or len(again.read_bytes()) > len(data) // 2)
    print(load_cpu_library(again).stepper_answer())
""")


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage"])
def test_a_damaged_cache_entry_is_rebuilt_not_loaded(tmp_path, how):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", DAMAGE_CHILD, str(tmp_path / "cache"), how],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["True True", "42"]


# -- a private cache: code is loaded only from files and a directory no one else can write ------------
PRIVATE_CHILD = textwrap.dedent("""
    import os, stat, sys
    from pathlib import Path
    from compiler.backends import BuildError, build_cpu_library, load_cpu_library
    cache, how = Path(sys.argv[1]), sys.argv[2]
    source = 'extern "C" int stepper_answer(void) { return 42; }\\n// ' + how + '\\n'
    if how == "umask":
        os.umask(0o002)                          # a cluster's group-writable default
    lib = build_cpu_library(source, "private", cache_dir=cache)
    if how == "open-file":
        lib.chmod(0o646)
    if how == "open-dir":
        cache.chmod(0o777)
    print(oct(stat.S_IMODE(lib.stat().st_mode)))
    try:
        print(load_cpu_library(lib).stepper_answer())
    except BuildError as exc:
        print("BuildError", exc)
""")


def private_child(cache, how):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", PRIVATE_CHILD, str(cache), how],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_cache_directory_is_created_private_and_libraries_stored_private_whatever_the_umask(tmp_path):
    cache = tmp_path / "new" / "cache"
    mode, answer = private_child(cache, "umask")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert int(mode, 8) & 0o022 == 0 and answer == "42"


def test_a_cache_directory_others_can_write_is_refused_naming_it_and_its_mode(tmp_path):
    cache = tmp_path / "shared"
    _, error = private_child(cache, "open-dir")
    assert error.startswith("BuildError refusing to load ")
    assert f"the kernel cache directory {cache} is writable by group and others (mode 0o777)" in error
    assert f"chmod go-w {cache}" in error and "compiler.backends.set_cache_dir(path)" in error


def test_a_library_others_can_write_is_refused_naming_it_and_its_mode(tmp_path):
    cache = tmp_path / "cache"
    mode, error = private_child(cache, "open-file")
    lib = next(cache.glob("private-*.so"))
    assert mode == "0o646" and f"the kernel library {lib} is writable by others (mode 0o646)" in error
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700           # the directory alone would pass
