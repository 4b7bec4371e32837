"""The IR verifier: structural invariants every pass must keep. Tests run it after each pass.

Checks that every Temp is defined before it is used (in program order, counting definitions in
enclosing and earlier blocks), defined once per block execution, and that each op's argument types
are exactly what its typing rule asks for (no implicit conversions left to the C++ compiler).
"""
from __future__ import annotations

from .. import ir
from ..builtins import OPS


class IRError(AssertionError):
    pass


def verify(fn: ir.Function, single_definition: bool = True) -> ir.Function:
    """Raise IRError on a broken invariant. Adjoint functions replay loop bodies again in the reverse
    sweep (re-assigning the same hoisted temps), so they are checked with single_definition=False."""
    _block(fn.body, set(), fn.name, single_definition)
    return fn


def _block(body, defined: set[int], where: str, single: bool):
    for s in body:
        for a in ir.used_operands(s):
            if isinstance(a, ir.Temp) and a.id not in defined:
                raise IRError(f"{where}: {a.name} used before definition in {type(s).__name__} at {s.loc}")
        for t in ir.defined_temps(s):
            if single and t.id in defined:
                raise IRError(f"{where}: {t.name} defined twice (second time in {type(s).__name__} at {s.loc})")
            defined.add(t.id)
        if isinstance(s, ir.Op):
            want, result = OPS[s.op].typing([a.type for a in s.args], [False] * len(s.args))
            if list(want) != [a.type for a in s.args] or result != s.out.type:
                raise IRError(f"{where}: {s.op}{tuple(a.type for a in s.args)} -> {s.out.type} does not match "
                              f"its typing rule {want} -> {result} at {s.loc}")
        if isinstance(s, ir.Assign) and s.value.type != s.var.type:
            raise IRError(f"{where}: assigning a {s.value.type} to {s.var.name}: {s.var.type} at {s.loc}")
        if isinstance(s, ir.If):
            _block(s.then, defined, where, single)
            _block(s.orelse, defined, where, single)
        elif isinstance(s, (ir.Loop, ir.ReverseLoop)):
            _block(s.body, defined, where, single)
        elif isinstance(s, ir.CustomAdjoint):
            _block(s.body, defined, where, single)
            _block(s.reverse, defined, where, single)
        elif isinstance(s, ir.CustomReplay):
            _block(s.body, defined, where, single)
            _block(s.replay, defined, where, single)
