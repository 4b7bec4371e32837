"""The API reference from the public names only.

``public-api`` documents the names listed in its body as ``stepper.<name>`` (or ``<prefix>.<name>``
with ``:prefix:``): autodoc finds each by importing the package and following attributes, so no page
names the module a thing is defined in, and moving modules does not touch the docs. Objects that
autodoc cannot document from a docstring of their own (dtypes, kernel builtins, markers) get an
entry written here from the object (``py:data``), or from the page's text after ``--``::

    ```{public-api}
    Model
    sin(x) -- sine, radians
    ```

When the whole site has been read, every name of ``stepper.__all__`` (and of ``stepper.jax`` /
``stepper.torch``) must have been documented exactly once: a missing, doubled or unknown name is a
warning, so the ``-W`` build fails when an export is added without its reference entry.
"""
from __future__ import annotations

import enum
import importlib
import inspect
import types

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.ext.autodoc.mock import mock
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

# The namespaces whose exports the reference must cover: (prefix, module whose __all__ lists them).
NAMESPACES = {"stepper": "stepper", "stepper.jax": "stepper.jax", "stepper.torch": "stepper.torch"}


def _import(config, modname: str):
    # autodoc's mocks (autodoc_mock_imports: torch) apply to our own imports too
    with mock(config.autodoc_mock_imports):
        return importlib.import_module(modname)


def _resolve(config, prefix: str, name: str):
    if prefix != "stepper":
        _import(config, prefix)
    obj = importlib.import_module("stepper")
    for part in prefix.split(".")[1:] + name.split("."):
        obj = getattr(obj, part)
    return obj


def _entry(full: str, obj, text: str | None) -> list[str]:
    """reST for one public object."""
    if text is not None:                       # described on the page (kernel builtins)
        sig = full if "(" in full else f"{full}()"
        return [f".. py:function:: {sig}", "", f"   {text}", ""]
    name = full.split("(")[0]
    if isinstance(obj, types.ModuleType):      # stepper.autograd: the module's text, then its functions
        lines = [f".. py:module:: {name}", "", *(inspect.getdoc(obj) or "").splitlines(), ""]
        for member in obj.__all__:
            lines += [f".. autofunction:: {name}.{member}", ""]
        return lines
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return [f".. autoclass:: {name}", "   :members:", "   :undoc-members:", ""]
    if isinstance(obj, type):
        return [f".. autoclass:: {name}", "   :members:", ""]
    if inspect.isfunction(obj):
        return [f".. autofunction:: {name}", ""]
    kind = type(obj).__name__                  # instances: dtypes, the adjoint marker
    doc = _describe_instance(obj) or inspect.getdoc(obj) or ""
    return [f".. py:data:: {name}", f"   :type: {kind}", "", *("   " + line for line in doc.splitlines()), ""]


def _describe_instance(obj) -> str | None:
    from compiler.types import MatrixType, ScalarType, VectorType
    if isinstance(obj, ScalarType):
        return (f"Scalar type: C++ ``{obj.ctype}``, NumPy ``{obj.np_dtype}``. Use it as an array's ``dtype`` "
                f"and, in kernels, as an annotation or a cast (``{obj.name}(x)``).")
    if isinstance(obj, VectorType):
        return (f"Vector of {obj.length} ``{obj.scalar.name}``: an array dtype and, in kernels, a constructor "
                f"(``{_public_name(obj)}(x, y, ...)``) supporting ``+ - *``, indexing and the vector builtins.")
    if isinstance(obj, MatrixType):
        return (f"{obj.rows} x {obj.cols} matrix of ``{obj.scalar.name}``: an array dtype and, in kernels, a "
                f"constructor; ``@`` multiplies, and the matrix builtins apply.")
    return None


def _public_name(obj) -> str:
    import stepper
    return next((n for n in stepper.__all__ if getattr(stepper, n) is obj), repr(obj))


class PublicApi(SphinxDirective):
    has_content = True
    option_spec = {"prefix": lambda arg: arg.strip()}

    def run(self):
        prefix = self.options.get("prefix", "stepper")
        store = _store(self.env)
        lines: list[str] = []
        for raw in self.content:
            if not raw.strip():
                continue
            spec, _, text = raw.partition(" -- ")
            spec = spec.strip()
            name = spec.split("(")[0]
            full = f"{prefix}.{spec}"
            try:
                obj = _resolve(self.config, prefix, name)
            except (ImportError, AttributeError) as e:
                logger.warning("public-api: %s.%s does not exist (%s); document only exported names",
                               prefix, name, e, location=self.get_location())
                continue
            store.setdefault((prefix, name), []).append(self.env.docname)
            lines += _entry(full, obj, text.strip() or None)
        # The pages are MyST Markdown, whose nested parse reads Markdown: hand autodoc's reST over as such
        lines = ["````{eval-rst}", *lines, "````"]
        node = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.get_source_info()[0]), self.content_offset, node)
        return node.children


def _store(env) -> dict:
    if not hasattr(env, "public_api_documented"):
        env.public_api_documented = {}
    return env.public_api_documented


def _purge(app, env, docname):
    store = _store(env)
    for key in list(store):
        store[key] = [d for d in store[key] if d != docname]
        if not store[key]:
            del store[key]


def _merge(app, env, docnames, other):
    for key, docs in _store(other).items():
        _store(env).setdefault(key, []).extend(docs)


def _check(app, env):
    store = _store(env)
    for prefix, modname in NAMESPACES.items():
        exported = _import(app.config, modname).__all__
        for name in exported:
            docs = store.get((prefix, name), [])
            if not docs:
                logger.warning("public-api: %s.%s is exported but not in the API reference "
                               "(add it to a {public-api} block under docs/api/)", prefix, name)
            elif len(docs) > 1:
                logger.warning("public-api: %s.%s is documented %d times (%s); keep one",
                               prefix, name, len(docs), ", ".join(docs))
        for (p, name) in store:
            if p == prefix and name not in exported:
                logger.warning("public-api: %s.%s is documented but not in %s.__all__", p, name, modname)


def setup(app):
    app.add_directive("public-api", PublicApi)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("env-check-consistency", _check)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
