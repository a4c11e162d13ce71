"""A fixed pool of recurrent-state slots beside the KV pool, sized from the cache budget by a ratio: how
SGLang keeps a hybrid model's Mamba and linear-attention state (MambaPool), unlike vLLM, whose block pool
holds that state as pages of the same table.

SGLang 0.5.23, python/sglang/srt/mem_cache/kv_cache_configurator.py (_handle_max_mamba_cache): with no
--max-mamba-cache-size and no speculative decoding, the state gets rest × r / (1 + r) of the memory left
for the caches (r = mamba_full_memory_ratio), cut into slots of one request's state over every recurrent
layer, less one slot for the pool's padding entry; the attention pool gets the rest less every slot it
allocated. The scheduler then runs at most slots // slots_per_request requests at once (the radix cache's
tracking slots: 3 + 2 with the extra buffer under the overlap scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from ..units import GiB


class StatePoolRule(BaseModel):
    """The ratio rule of a release: `full_memory_ratio` of state to attention memory, the padding slots
    allocated beyond the slots counted, and the state slots one running request holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    full_memory_ratio: float = Field(gt=0)
    padding_slots: int = Field(ge=0)
    slots_per_request: int = Field(gt=0)
    # the SSM state's dtype where the config names none (SGLang: float32; its conv state stays 16-bit)
    ssm_dtype_default: str = Field(min_length=1)

    def pool(self, cache_budget_bytes: int, slot_bytes: int) -> StatePool | None:
        """The slots this budget buys; None where the model holds no recurrent state."""
        if slot_bytes <= 0:
            return None
        # SGLang works in GiB floats: rest_gib × r / (1 + r), back to bytes
        state_budget = cache_budget_bytes / GiB * self.full_memory_ratio / (1 + self.full_memory_ratio) * GiB
        slots = int((state_budget - self.padding_slots * slot_bytes) // slot_bytes)
        return StatePool(slot_bytes, max(0, slots), self.padding_slots, self.slots_per_request,
                         self.full_memory_ratio)


@dataclass(frozen=True)
class StatePool:
    slot_bytes: int  # one request's recurrent state over the stage's recurrent layers
    slots: int  # the engine's max_mamba_cache_size
    padding_slots: int
    slots_per_request: int
    full_memory_ratio: float

    @property
    def reserved_bytes(self) -> int:
        """What the engine takes out of the cache memory before the KV pool: the slots and the padding slots the
        release counts."""
        return (self.slots + self.padding_slots) * self.slot_bytes

    @property
    def allocated_bytes(self) -> int:
        """What the pool allocates: one padding slot beyond the slots (MambaPool's size + 1), counted out of the
        cache memory or not (0.5.16 and earlier allocate it beyond)."""
        return (self.slots + 1) * self.slot_bytes

    @property
    def max_requests(self) -> int:
        """The running requests the state slots hold (SGLang caps max_running_requests there)."""
        return self.slots // self.slots_per_request


def state_split(pool: StatePool | None, state_bytes: int) -> tuple[int, int]:
    """(state bytes set aside before the KV pool, state bytes each running request adds): an engine's own slot pool
    is set aside whole, else each request holds its state beside its KV."""
    return (pool.reserved_bytes, 0) if pool is not None else (0, state_bytes)
