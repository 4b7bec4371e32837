"""Compile errors speak about the user's code: this file's path, the exact line, the source line with a
caret and a hint, never our internals. And a missing C++ compiler is a clear error, while a cached
module loads without one."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import compiler as sp

THIS_FILE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    """The line of this file that carries `marker` (exactly once), so tests never hard-code numbers."""
    with open(THIS_FILE) as f:
        hits = [k for k, text in enumerate(f, start=1) if text.rstrip().endswith(marker)]
    assert len(hits) == 1, marker
    return hits[0]


def plain_python_helper(v):
    return v * 2.0


@sp.kernel
def uses_list(x: sp.array(dtype=float)):
    i = sp.tid()
    v = [x[i], 2.0]  # <- list
    x[i] = v[0]


@sp.kernel
def uses_dict(x: sp.array(dtype=float)):
    i = sp.tid()
    d = {"a": x[i]}  # <- dict
    x[i] = 1.0


@sp.kernel
def uses_lambda(x: sp.array(dtype=float)):
    i = sp.tid()
    f = lambda t: t * 2.0  # <- lambda
    x[i] = 1.0


@sp.kernel
def uses_try(x: sp.array(dtype=float)):
    i = sp.tid()
    try:  # <- try
        x[i] = 1.0
    except ValueError:
        pass


@sp.kernel
def uses_with(x: sp.array(dtype=float)):
    i = sp.tid()
    with open("data.txt"):  # <- with
        x[i] = 1.0


@sp.kernel
def uses_comprehension(x: sp.array(dtype=float)):
    i = sp.tid()
    v = [x[i] * k for k in range(3)]  # <- comprehension
    x[i] = 1.0


@sp.func
def ping(v: float, n: int) -> float:
    return pong(v, n - 1)


@sp.func
def pong(v: float, n: int) -> float:
    return ping(v * 0.5, n)  # <- recursion


@sp.kernel
def uses_recursion(x: sp.array(dtype=float)):
    i = sp.tid()
    x[i] = ping(x[i], 3)


@sp.kernel
def calls_plain_python(x: sp.array(dtype=float)):
    i = sp.tid()
    x[i] = plain_python_helper(x[i])  # <- plain python


@sp.kernel
def unknown_name(x: sp.array(dtype=float)):
    i = sp.tid()
    x[i] = x[i] + undefined_thing  # <- unknown name  # noqa: F821


@sp.kernel
def float64_into_float32_local(a: sp.array(dtype=float), b: sp.array(dtype=sp.float64)):
    i = sp.tid()
    t = a[i]
    t = b[i]  # <- float64 into float32 local
    a[i] = t


@sp.kernel
def mixes_float32_and_float64(a: sp.array(dtype=float), b: sp.array(dtype=sp.float64)):
    i = sp.tid()
    a[i] = a[i] + b[i]  # <- mixed precision


@sp.kernel
def vector_times_vector(a: sp.array(dtype=sp.vec3)):
    i = sp.tid()
    a[i] = a[i] * a[i]  # <- vec * vec


@sp.kernel
def sqrt_of_two_values(x: sp.array(dtype=float)):
    i = sp.tid()
    x[i] = sp.sqrt(x[i], x[i])  # <- sqrt of two values


@sp.kernel
def calls_a_kernel(x: sp.array(dtype=float)):
    i = sp.tid()
    uses_lambda(x)  # <- kernel calls kernel


def launch_args(kernel, device="cpu"):
    if kernel in (float64_into_float32_local, mixes_float32_and_float64):
        return [sp.zeros(2, device=device), sp.zeros(2, dtype=sp.float64, device=device)]
    if kernel is vector_times_vector:
        return [sp.zeros(2, dtype=sp.vec3, device=device)]
    return [sp.zeros(2, device=device)]


CASES = [
    (uses_list, "# <- list", "list"),
    (uses_dict, "# <- dict", "dict"),
    (uses_lambda, "# <- lambda", "lambda"),
    (uses_try, "# <- try", "try"),
    (uses_with, "# <- with", "with"),
    (uses_comprehension, "# <- comprehension", "comprehension"),
    (uses_recursion, "# <- recursion", "recursi"),
    (calls_plain_python, "# <- plain python", "plain_python_helper"),
    (unknown_name, "# <- unknown name  # noqa: F821", "undefined_thing"),
    (float64_into_float32_local, "# <- float64 into float32 local", "'t'"),
    (mixes_float32_and_float64, "# <- mixed precision", "float64"),
    (vector_times_vector, "# <- vec * vec", "vec3"),
    (sqrt_of_two_values, "# <- sqrt of two values", "sqrt() takes 1 argument(s), got 2"),
    (calls_a_kernel, "# <- kernel calls kernel", "uses_lambda is a @kernel, and kernels cannot call kernels"),
]


@pytest.mark.parametrize("kernel, marker, mentions", CASES, ids=[c[0].__name__ for c in CASES])
def test_compile_error_points_at_the_user_line(kernel, marker, mentions, device):
    with pytest.raises(sp.CompileError) as e:
        sp.launch(kernel, 2, inputs=launch_args(kernel, device=device))
    err = e.value
    text = str(err)
    line = line_of(marker)
    with open(THIS_FILE) as f:
        source_line = f.read().splitlines()[line - 1].strip()
    assert err.filename == THIS_FILE and err.lineno == line
    assert text.startswith(f"{THIS_FILE}:{line}:"), text
    assert mentions in text
    lines = text.splitlines()
    code = next(k for k, t in enumerate(lines) if t.strip() == source_line)      # the source line ...
    assert lines[code + 1].strip().startswith("^")                               # ... and a caret
    assert any(t.startswith("hint: ") and len(t) > len("hint: ") for t in lines), text
    for internal in ("compiler/frontend", "compiler/", "frontend_calls", "typing_rules", "Traceback", "site-packages"):
        assert internal not in text.replace(THIS_FILE, "<test file>"), (internal, text)   # (a checkout may sit under .../compiler/)


def test_caret_sits_under_the_offending_column(device):
    with pytest.raises(sp.CompileError) as e:
        sp.launch(unknown_name, 2, inputs=[sp.zeros(2, device=device)])
    lines = str(e.value).splitlines()
    code, caret = lines[1], lines[2]
    assert code.strip() == "x[i] = x[i] + undefined_thing  # <- unknown name  # noqa: F821"
    assert code[caret.index("^"):].startswith("undefined_thing")


def test_a_broken_kernel_does_not_break_its_neighbours(device):
    out = sp.zeros(3, device=device)
    sp.launch(fine_neighbour, 3, outputs=[out])
    np.testing.assert_array_equal(out.numpy(), [0.0, 1.0, 2.0])


@sp.kernel
def fine_neighbour(x: sp.array(dtype=float)):
    i = sp.tid()
    x[i] = float(i)


# ---- the C++ compiler and the cache, in child processes --------------------------------------------
CHILD = textwrap.dedent('''
    import sys
    import numpy as np
    import compiler as sp
    from compiler.backends import set_cache_dir

    set_cache_dir(sys.argv[1])

    @sp.kernel
    def double_it(x: sp.array(dtype=float)):
        i = sp.tid()
        x[i] = x[i] * 2.0 + 0.25

    x = sp.array(np.arange(3, dtype=np.float32))
    try:
        sp.launch(double_it, 3, inputs=[x])
    except Exception as e:
        print(type(e).__name__)
        print(e)
        sys.exit(3)
    print("OK", x.numpy().tolist())
''')


def run_child(tmp_path, cache, **env_changes):
    script = tmp_path / "child_kernels.py"
    script.write_text(CHILD)
    env = dict(os.environ)
    for k, v in env_changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, str(script), str(cache)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)


def test_no_cxx_compiler_is_a_clear_error(tmp_path):
    proc = run_child(tmp_path, tmp_path / "empty-cache", CXX="/nonexistent/c++")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    name, message = proc.stdout.split("\n", 1)
    assert name == "CompilerNotFoundError"
    assert "/nonexistent/c++" in message and "$CXX" in message
    assert "c++" in message and "g++" in message and "clang++" in message     # what unsetting CXX would try
    assert "apt-get install g++" in message                                     # and how to get one


def test_no_compiler_on_path_lists_what_was_tried(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    proc = run_child(tmp_path, tmp_path / "empty-cache", CXX=None, PATH=str(empty))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    name, message = proc.stdout.split("\n", 1)
    assert name == "CompilerNotFoundError"
    assert "c++, g++, clang++" in message and str(empty) in message


def test_second_process_loads_from_the_cache_without_a_compiler(tmp_path):
    cache = tmp_path / "cache"
    first = run_child(tmp_path, cache)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.strip() == "OK [0.25, 2.25, 4.25]"
    libraries = sorted(p.name for p in cache.glob("*.so"))
    assert libraries
    second = run_child(tmp_path, cache, CXX="/nonexistent/c++")
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.strip() == "OK [0.25, 2.25, 4.25]"
    assert sorted(p.name for p in cache.glob("*.so")) == libraries           # nothing new was built


def test_a_python_type_that_is_not_a_dtype_says_what_dtypes_are():
    with pytest.raises(TypeError, match=r"<class 'list'> is not a dtype; use float32, float64"):
        sp.array(dtype=list)
