"""Sphinx configuration for the stepper documentation.

Why Sphinx (with MyST and autodoc/napoleon): it is the tool of the ecosystem our users come from
(NumPy, JAX, Warp and Devito document with it), and autodoc imports the objects, so the reference is
written against the public names (``stepper.Model``), never against module paths.

Build: ``python -m sphinx -W -b html docs docs/_build/html`` (tests/test_docs.py runs it).
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                     # the tree being documented, not an installed copy
sys.path.insert(0, str(pathlib.Path(__file__).parent / "_ext"))

project = "stepper"
copyright = "the stepper authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "public_api"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# Docstrings write code as `x` (Markdown habit) and ``x`` (reST): render both as code.
default_role = "literal"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True}
autodoc_mock_imports = ["torch"]                  # stepper.torch is documented without PyTorch installed
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "alabaster"
html_title = "stepper"
html_static_path = []
