"""A module's generated source, and so its kernel cache key, does not depend on what the process
compiled before: the IR's temps and vars take their ids from one counter per process, and a module
whose kernels were first compiled in another order used to render (and build) again."""
import subprocess
import sys
import textwrap

KERNELS = '''
import stepper as sp

F32 = sp.array(dtype=sp.float32)


@sp.kernel
def blur(u: F32, out: F32):
    i = sp.tid()
    v = sp.float32(0.0)
    if i > 0 and i < u.shape[0] - 1:
        v = 0.25 * u[i - 1] + 0.5 * u[i] + 0.25 * u[i + 1]
    out[i] = v


@sp.kernel
def ratio(a: F32, b: F32, out: F32):
    i = sp.tid()
    out[i] = a[i] / (1.0 + b[i] * b[i])
'''

RENDER = textwrap.dedent('''
    import hashlib, sys
    sys.path.insert(0, sys.argv[1])
    import stable_source_kernels as m
    from compiler.codegen.targets import render_cpu, render_cuda
    for name in sys.argv[2].split(","):
        getattr(m, name).compiled()
    functions = [k.compiled().functions() for k in (m.blur, m.ratio)]
    for render in (render_cpu, render_cuda):
        print(hashlib.sha1(render(functions, False).source.encode()).hexdigest())
''')


def _hashes(tmp_path, order: str) -> str:
    done = subprocess.run([sys.executable, "-c", RENDER, str(tmp_path), order], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_modules_source_does_not_depend_on_the_order_its_kernels_were_compiled_in(tmp_path):
    (tmp_path / "stable_source_kernels.py").write_text(KERNELS)
    assert _hashes(tmp_path, "blur,ratio") == _hashes(tmp_path, "ratio,blur")
