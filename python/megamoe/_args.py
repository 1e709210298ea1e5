"""Argument checks shared by the framework-neutral and the torch entry points."""

from __future__ import annotations

import operator
from typing import Any, Optional

__all__ = ["no_tokens", "optional_int"]


def no_tokens(hidden_states: Any) -> bool:
    """True when ``hidden_states`` is an array of shape ``[0, H]``.

    The reference reads ``num_tokens = hidden_states.shape[0]`` and returns at 0 before it
    looks at any other argument, so such a call must not fail on the others. Only objects
    that export an array (DLPack or NumPy's array interface) count: anything else is left
    to the binding, which raises the TypeError for it.
    """
    try:
        if not (hasattr(hidden_states, "__dlpack__") or hasattr(hidden_states, "__array_interface__")):
            return False
        shape = tuple(hidden_states.shape)
        return len(shape) == 2 and shape[0] == 0
    except Exception:  # a broken .shape: the binding reports what is wrong with the array
        return False


def optional_int(value: Any, name: str, what: str = "an int") -> Optional[int]:
    """``value`` as an int (anything with ``__index__``), or None; TypeError naming ``name``
    otherwise (no ``int()``: it would turn "12" or 3.7 into a number)."""
    if value is None or type(value) is int:
        return value
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"megamoe: {name}: expected {what} or None, got {type(value).__name__}"
        ) from None
