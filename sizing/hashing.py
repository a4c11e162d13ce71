"""Hashing for the frozen records used as cache keys (shapes, scenarios, engines)."""

from __future__ import annotations

_SLOT = "_hash_once"


def hash_once(cls):
    """Compute a frozen dataclass's field hash once per instance.

    A model shape holds hundreds of per-layer records; the caches in plan.py hash it on every
    lookup, which costs more than the arithmetic they save. The stored hash is dropped on
    pickling, since string hashes differ between processes."""
    field_hash = cls.__hash__

    def __hash__(self):
        try:
            return self.__dict__[_SLOT]
        except KeyError:
            value = field_hash(self)
            object.__setattr__(self, _SLOT, value)
            return value

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop(_SLOT, None)
        return state

    cls.__hash__ = __hash__
    cls.__getstate__ = __getstate__
    return cls
