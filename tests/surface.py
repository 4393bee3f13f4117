"""Does an object have a protocol's surface? isinstance() on a runtime-checkable Protocol only
checks that the names exist; this compares each method's parameters too."""

from __future__ import annotations

import inspect
from typing import Any


def protocol_members(protocol: type) -> dict[str, Any]:
    """Name -> the protocol's own definition (None for a plain annotated attribute)."""
    members: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if not getattr(klass, "_is_protocol", False) or klass.__module__ == "typing":
            continue
        for name in vars(klass).get("__annotations__", {}):
            members.setdefault(name, None)
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                members[name] = value
    return members


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    signature = inspect.signature(function)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def surface_differences(obj: object, protocol: type) -> list[str]:
    """What `obj` lacks or defines differently: missing members, methods whose parameters
    (names, kinds, defaults) are not the protocol's."""
    differences = []
    for name, definition in protocol_members(protocol).items():
        if not hasattr(obj, name):
            differences.append(f"{name}: missing")
            continue
        if not inspect.isfunction(definition):
            continue  # an attribute or property: having it is the whole surface
        implementation = inspect.getattr_static(type(obj), name, None)
        if isinstance(implementation, (staticmethod, classmethod)) or not callable(implementation):
            differences.append(f"{name}: not a plain method")
            continue
        if _parameters(definition) != _parameters(implementation):
            have, want = inspect.signature(implementation), inspect.signature(definition)
            differences.append(f"{name}{have}, the protocol's {name}{want}")
    return differences
