"""What the engine plug-ins share: the opt-in variable, recorded signatures and the check
that a target (the engine's function) and a replacement (megamoe's) fit them."""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, Optional

REQUIRED = inspect.Parameter.empty

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def enabled(variable: str, logger: logging.Logger) -> bool:
    """Whether the opt-in ``variable`` is on. Unset or an off value (0, false, no, off, empty)
    is off without a word, since engines load their plug-ins in every process; anything
    else is off with a warning, so that a typo does not pass for a choice."""
    value = os.environ.get(variable)
    if value is None:
        return False
    word = value.strip().lower()
    if word in _ON:
        return True
    if word not in _OFF:
        logger.warning(
            "megamoe: %s=%r is neither on (1, true, yes, on) nor off (0, false, no, off); the plug-in stays off",
            variable,
            value,
        )
    return False


def recorded(*names: str, **defaults: Any) -> inspect.Signature:
    """A recorded signature: positional-or-keyword parameters ``names`` without defaults,
    then ``defaults`` (in the order given) with theirs. Annotations are not recorded: the
    engines spell them differently across versions (strings, ``X | None``, ``Optional``)
    and they do not change what a call binds to."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind) for n in names]
    params += [inspect.Parameter(n, kind, default=d) for n, d in defaults.items()]
    return inspect.Signature(params)


def _same_default(a: Any, b: Any) -> bool:
    """Equal defaults of the same type (so that 1, 1.0 and True stay apart)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == raises is no match
        return False


def _default_text(value: Any) -> str:
    return "none (required)" if value is REQUIRED else repr(value)


def _params(fn: Callable[..., Any]) -> "tuple[list, Optional[str]]":
    try:
        return list(inspect.signature(fn).parameters.values()), None
    except (TypeError, ValueError) as e:
        return [], f"its signature cannot be read ({e})"


def signature_difference(fn: Callable[..., Any], expected: inspect.Signature) -> Optional[str]:
    """None when ``fn`` has exactly ``expected``'s parameters (names, order, kinds,
    defaults), else the first difference in words."""
    got, error = _params(fn)
    if error:
        return error
    want = list(expected.parameters.values())
    got_names = [p.name for p in got]
    want_names = {p.name for p in want}
    for i, w in enumerate(want):
        g = got[i] if i < len(got) else None
        if g is None or g.name != w.name:
            if w.name in got_names:
                return f"parameter {w.name!r} is at position {got_names.index(w.name)}, recorded at position {i}"
            if g is None or g.name in want_names:
                return f"parameter {w.name!r} (position {i}) is missing"
            return f"parameter {i} is named {g.name!r}, recorded {w.name!r}"
        if g.kind != w.kind:
            return f"parameter {w.name!r} is {g.kind.description}, recorded {w.kind.description}"
        if not _same_default(g.default, w.default):
            return f"parameter {w.name!r} has default {_default_text(g.default)}, recorded {_default_text(w.default)}"
    if len(got) > len(want):
        return f"parameter {got[len(want)].name!r} (position {len(want)}) is not in the recorded signature"
    return None


def replacement_difference(fn: Callable[..., Any], expected: inspect.Signature) -> Optional[str]:
    """None when ``fn`` binds every call ``expected`` allows to the same parameters: the
    recorded ones first, same names, kinds and defaults, then only parameters that have a
    default (megamoe's additions), else the first difference in words."""
    got, error = _params(fn)
    if error:
        return error
    want = list(expected.parameters.values())
    for i, w in enumerate(want):
        g = got[i] if i < len(got) else None
        if g is None or g.name != w.name or g.kind != w.kind or not _same_default(g.default, w.default):
            return f"it does not take {w.name!r} (position {i}) as the recorded signature does"
    for g in got[len(want) :]:
        if g.default is REQUIRED and g.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return f"it requires {g.name!r}, which the recorded signature does not pass"
    return None
