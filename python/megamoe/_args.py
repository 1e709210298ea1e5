"""Argument checks shared by the framework-neutral and the torch entry points."""

from __future__ import annotations

from typing import Any

from ._signature import optional_float, optional_int, stream_int

__all__ = ["no_tokens", "optional_int", "optional_float", "stream_int", "shape_of"]


def no_tokens(hidden_states: Any) -> bool:
    """True when ``hidden_states`` is an array of shape ``[0, H]``.

    The reference reads ``num_tokens = hidden_states.shape[0]`` and returns at 0 before it
    looks at any other argument, so such a call must not fail on the others (callers ask
    this only outside full-buffer mode, whose top-k tail is filled even then). Only objects
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


def shape_of(x: Any) -> tuple:
    """``x.shape`` as a tuple of ints, or () for objects without a usable shape (the
    library reports what is wrong with them)."""
    try:
        return tuple(int(n) for n in x.shape)
    except Exception:
        return ()
