"""The README's Python snippets run as written."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path):
    from compiler.runtime.device import is_cuda_available
    for framework in ("jax", "torch"):        # optional extras: their snippets run where they are installed
        if f"import stepper.{framework}" in SNIPPETS[index]:
            pytest.importorskip(framework, reason=f"the snippet needs {framework}, which is not installed")
    script = tmp_path / f"snippet{index}.py"
    script.write_text(SNIPPETS[index])
    env = dict(os.environ)
    if 'device="cuda"' in SNIPPETS[index] and not is_cuda_available():
        env["STEPPER_CUDA_SIM"] = "1"            # GPU snippets run on the CUDA simulator without a GPU
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
