"""Check that a test double has the interface of what it stands for.

``runtime_checkable`` protocols only check that method *names* exist; a double whose method
lost a parameter, renamed one, or gained a required one would still pass ``isinstance`` and
silently test something the real code never calls. :func:`interface_mismatches` compares every
public method of the interface with the double's: parameter names, kinds, which ones have a
default, and the annotations as written.
"""

from __future__ import annotations

import inspect
from typing import Any


def interface_methods(interface: type) -> list[str]:
    """The public methods an interface (a Protocol or an abstract base class) declares."""
    names = []
    for klass in interface.__mro__:
        if klass is object or klass.__module__ == "typing":
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and callable(value) and name not in names:
                names.append(name)
    return sorted(names)


def _shape(fn: Any) -> list[tuple[str, Any, bool, str]]:
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    shape = [
        (p.name, p.kind, p.default is not inspect.Parameter.empty, _text(p.annotation))
        for p in params
    ]
    return [*shape, ("return", None, False, _text(sig.return_annotation))]


def _text(annotation: Any) -> str:
    if annotation is inspect.Signature.empty:
        return ""
    return str(annotation).replace(" ", "")


def interface_mismatches(double: type, interface: type) -> list[str]:
    """What differs between ``double`` and ``interface`` (empty: the double conforms)."""
    problems = []
    for name in interface_methods(interface):
        mine = getattr(double, name, None)
        if not callable(mine):
            problems.append(f"{double.__name__} has no method {name}")
            continue
        want, got = _shape(getattr(interface, name)), _shape(mine)
        if want != got:
            problems.append(
                f"{double.__name__}.{name}{inspect.signature(mine)} differs from "
                f"{interface.__name__}.{name}{inspect.signature(getattr(interface, name))}"
            )
    return problems
