"""The documentation works: every ```python block of README.md and docs/ runs as written, and the site
builds with Sphinx with warnings as errors (so a broken docstring, a dead cross-reference or an export
missing from the API reference fails here).

A block that cannot run in the suite (it needs ``mpiexec``, a GPU or a long run) says why on the line
before its fence, in a comment the page does not show: ``<!-- skip: needs mpiexec -n 2 -->``.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md"] + sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
FENCE = re.compile(r"^(?:<!-- skip: (?P<skip>.+?) -->\n)?```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```$", re.S | re.M)


def _blocks():
    seen = set()                      # a block shown on two pages (README and a guide) runs once
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m["lang"].strip() == "python" and m["code"] not in seen:
                seen.add(m["code"])
                line = text.count("\n", 0, m.start("code"))
                yield pytest.param(m["code"], m["skip"], id=f"{page.relative_to(ROOT)}:{line}")


BLOCKS = list(_blocks())


def test_pages_have_blocks():
    assert len(BLOCKS) >= 15, [p.id for p in BLOCKS]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_are_fenced_as_python(page):
    """Python is fenced ```python, so that it runs here; other fences are for other languages."""
    langs = {m["lang"].strip() for m in FENCE.finditer(page.read_text())}
    assert not langs & {"py", "python3", "pycon", "{code-block} python"}, \
        f"{page.name}: fence Python as ```python (with <!-- skip: why --> if it cannot run)"


@pytest.mark.parametrize("code, skip", BLOCKS)
def test_python_block_runs(code, skip, tmp_path):
    from compiler.runtime.device import is_cuda_available
    if skip:
        pytest.skip(skip)
    for framework in ("jax", "torch", "scipy"):   # optional extras: their blocks run where they are installed
        if re.search(rf"^\s*(import|from) (stepper\.)?{framework}\b", code, re.M):
            pytest.importorskip(framework, reason=f"the block needs {framework}, which is not installed")
    script = tmp_path / "block.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if 'device="cuda"' in code and not is_cuda_available():
        env["STEPPER_CUDA_SIM"] = "1"            # GPU blocks run on the CUDA simulator without a GPU
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]


def test_site_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="the docs extra (sphinx, myst-parser) is not installed")
    pytest.importorskip("myst_parser", reason="the docs extra (sphinx, myst-parser) is not installed")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
                          str(DOCS), str(tmp_path / "html")], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, STEPPER_PROGRESS="0"))
    assert run.returncode == 0, run.stderr[-5000:]
    assert (tmp_path / "html" / "api" / "models.html").exists()


def test_reference_check_names_what_is_missing_doubled_or_not_exported(caplog):
    """The build's completeness check (docs/_ext/public_api.py) on a reference that lost stepper.Model,
    documents stepper.Revolve twice and documents a name that is not exported."""
    pytest.importorskip("sphinx", reason="the docs extra (sphinx, myst-parser) is not installed")
    import types
    import stepper
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import public_api
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    app = types.SimpleNamespace(config=types.SimpleNamespace(autodoc_mock_imports=["torch"]))
    try:
        exported = {prefix: public_api._import(app.config, module).__all__
                    for prefix, module in public_api.NAMESPACES.items()}
        documented = {(prefix, name): ["api/page"] for prefix, names in exported.items() for name in names}
        del documented[("stepper", "Model")]
        documented[("stepper", "Revolve")] = ["api/checkpoint", "api/models"]
        documented[("stepper", "Partition")] = ["api/models"]
        with caplog.at_level("WARNING"):
            public_api._check(app, types.SimpleNamespace(public_api_documented=documented))
    finally:                          # without PyTorch, stepper.torch was imported against a mock: forget it
        if "torch" not in sys.modules:
            sys.modules.pop("stepper.torch", None)
            stepper.__dict__.pop("torch", None)
    assert sorted(r.getMessage() for r in caplog.records) == [
        "public-api: stepper.Model is exported but not in the API reference (add it to a {public-api} block "
        "under docs/api/)",
        "public-api: stepper.Partition is documented but not in stepper.__all__",
        "public-api: stepper.Revolve is documented 2 times (api/checkpoint, api/models); keep one",
    ]
