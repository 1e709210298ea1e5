"""Argument checks shared by the framework-neutral and the torch entry points, and the
error of an allocation that cannot be made, shared by the allocating helpers."""

from __future__ import annotations

from typing import Any, Callable

from ._signature import _INT64_MAX, optional_float, optional_int, stream_int

__all__ = ["no_tokens", "optional_int", "optional_float", "stream_int", "shape_of", "allocate"]


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


# What a torch allocator's RuntimeError says when the memory is not there (CPU:
# "DefaultCPUAllocator: not enough memory" / "can't allocate memory"; CUDA:
# torch.OutOfMemoryError's "out of memory"; sizes past its arithmetic: "overflow").
_NO_MEMORY = ("out of memory", "not enough memory", "can't allocate", "cannot allocate", "overflow")


def _no_memory(e: RuntimeError) -> bool:
    """True when a RuntimeError of an allocator is a size it cannot serve. Other
    RuntimeErrors (e.g. a sticky CUDA error of earlier work that surfaces at the
    allocation) are no statement about the size and pass as they are."""
    if type(e).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
        return True
    text = str(e).lower()
    return any(w in text for w in _NO_MEMORY)


def allocate(where: str, what: str, nbytes: int, make: Callable[[], Any]) -> Any:
    """``make()``, which allocates ``nbytes`` bytes for ``what``. An allocation that cannot
    be made is the documented ValueError naming its bytes, whatever the allocator raised:
    NumPy's MemoryError or ValueError ("array is too big"), torch's RuntimeError /
    OutOfMemoryError; that error is chained and its text kept. A size beyond int64 is
    refused without asking (no allocator addresses it; NumPy would say only that the
    dimension is too large)."""
    if nbytes > _INT64_MAX:
        raise ValueError(f"{where}: cannot allocate {nbytes} bytes for {what}: more than int64 can address")
    try:
        return make()
    except (MemoryError, ValueError, OverflowError) as e:
        raise ValueError(f"{where}: cannot allocate {nbytes} bytes for {what} ({type(e).__name__}: {e})") from e
    except RuntimeError as e:
        if not _no_memory(e):
            raise
        raise ValueError(f"{where}: cannot allocate {nbytes} bytes for {what} ({type(e).__name__}: {e})") from e
