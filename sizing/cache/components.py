"""The byte arithmetic of a KV format: each stored tensor is a Component, a dtype width in bits and a
granularity that says how many elements it holds for ``tokens`` tokens of one head of ``head_dim`` values; a
SideLayout is what one side (K or V) of one layer stores. Bytes are exact integers: a component of E elements
of b bits takes ceil(E * b / 8) bytes."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from ..errors import KvsizeError
from ..units import cdiv, ceil_fraction

Role = Literal["payload", "metadata"]


# -- granularities: how many elements a component holds -------------------------------


@dataclass(frozen=True)
class PerValue:
    """One element per stored value: tokens x head_dim."""

    per_head = True

    def elements(self, tokens: int, head_dim: int) -> int:
        return tokens * head_dim

    def describe(self) -> str:
        return "per value"


@dataclass(frozen=True)
class PerValueGroup:
    """One element per `group` consecutive values of one token's head vector."""

    group: int
    per_head = True

    def elements(self, tokens: int, head_dim: int) -> int:
        return tokens * cdiv(head_dim, self.group)

    def check(self, head_dim: int, fmt: str) -> None:
        if head_dim % self.group:
            raise KvsizeError(
                f"{fmt} stores blocks of {self.group} values, but head_dim {head_dim} is not a multiple of "
                f"{self.group}; choose another --kv-cache-dtype"
            )

    def describe(self) -> str:
        return f"per {self.group} values"


@dataclass(frozen=True)
class PerTokenHead:
    """One element per token per head."""

    per_head = True

    def elements(self, tokens: int, head_dim: int) -> int:
        return tokens

    def describe(self) -> str:
        return "per token per head"


@dataclass(frozen=True)
class PerChannelTokenGroup:
    """One element per channel per `group` tokens (KIVI's per-channel key quantization)."""

    group: int
    per_head = True

    def elements(self, tokens: int, head_dim: int) -> int:
        return cdiv(tokens, self.group) * head_dim

    def describe(self) -> str:
        return f"per channel per {self.group} tokens"


@dataclass(frozen=True)
class OutliersPerRow:
    """Sparse outliers: ceil(fraction * head_dim) slots per token per head (dense-and-sparse)."""

    fraction: Fraction
    per_head = True

    def elements(self, tokens: int, head_dim: int) -> int:
        return tokens * ceil_fraction(self.fraction * head_dim)

    def describe(self) -> str:
        return f"{float(self.fraction):.2%} of values per token per head"


@dataclass(frozen=True)
class PerLayer:
    """`count` elements per layer and side, whatever the tokens (per-tensor scales, codebooks).
    `parameter`: the engine keeps it as a parameter of the attention layer, loaded with the
    weights, not in the KV pool (vLLM's k_scale and v_scale, vllm/attention/layer.py)."""

    count: int = 1
    parameter: bool = False
    per_head = False

    def elements(self, tokens: int, head_dim: int) -> int:
        return self.count

    def describe(self) -> str:
        return "per layer" if self.count == 1 else f"{self.count} per layer"


@dataclass(frozen=True)
class PerTokenHeadFixed:
    """`count` elements per token per head, whatever the head size (fp8_ds_mla's parts, DSA's indexer key)."""

    count: int
    of_head_dim: int | None = None  # the head size the layout is cut for (fp8_ds_mla: the 576-value latent)
    per_head = True

    def elements(self, tokens: int, head_dim: int) -> int:
        return tokens * self.count

    def check(self, head_dim: int, fmt: str) -> None:
        if self.of_head_dim is not None and head_dim != self.of_head_dim:
            raise KvsizeError(f"{fmt} is laid out for a {self.of_head_dim}-value MLA latent, but this model's "
                              f"head is {head_dim} values; choose another --kv-cache-dtype")

    def describe(self) -> str:
        return f"{self.count} per token per head"


Granularity = (PerValue | PerValueGroup | PerTokenHead | PerChannelTokenGroup | OutliersPerRow | PerLayer
               | PerTokenHeadFixed)


@dataclass(frozen=True)
class Component:
    """One stored tensor of a format."""

    name: str
    dtype: str
    bits: int
    granularity: Granularity
    role: Role = "metadata"

    def bytes_for(self, tokens: int, head_dim: int, heads: int) -> int:
        elements = self.granularity.elements(tokens, head_dim)
        if self.granularity.per_head:
            elements *= heads
        return cdiv(elements * self.bits, 8)


@dataclass(frozen=True)
class SideLayout:
    """What one side (K or V) of one layer stores."""

    components: tuple[Component, ...]
    recent_full_precision_tokens: int = 0  # KIVI keeps the latest R tokens unquantized

    def bytes_for(self, tokens: int, head_dim: int, heads: int) -> tuple[int, int]:
        """(payload_bytes, metadata_bytes) for `tokens` tokens of one sequence."""
        recent = min(tokens, self.recent_full_precision_tokens)
        quantized = tokens - recent
        payload = metadata = 0
        for component in self.components:
            if not component.granularity.per_head:
                continue  # per-layer tensors are counted once per layer, see layer_bytes
            size = component.bytes_for(quantized, head_dim, heads)
            if component.role == "payload":
                payload += size
            else:
                metadata += size
        payload += recent * head_dim * heads * 2  # fp16
        return payload, metadata

    def layer_bytes(self, head_dim: int) -> int:
        """Bytes stored once per layer and side, independent of tokens and sequences."""
        return sum(
            c.bytes_for(0, head_dim, 1) for c in self.components if not c.granularity.per_head
        )

    def parameter_bytes(self, head_dim: int) -> int:
        """The part of layer_bytes that the engine keeps with the weights, not in the KV pool."""
        return sum(
            c.bytes_for(0, head_dim, 1) for c in self.components
            if not c.granularity.per_head and c.granularity.parameter
        )

    def token_bytes(self, head_dim: int) -> tuple[Fraction, Fraction]:
        """Steady-state (payload, metadata) bytes per token per head, as exact fractions."""
        payload = metadata = Fraction(0)
        for component in self.components:
            g = component.granularity
            if not g.per_head:
                continue
            if isinstance(g, PerChannelTokenGroup):
                per_token = Fraction(head_dim * component.bits, 8 * g.group)
            else:
                per_token = Fraction(g.elements(1, head_dim) * component.bits, 8)
            if component.role == "payload":
                payload += per_token
            else:
                metadata += per_token
        return payload, metadata

    def check(self, head_dim: int, fmt: str) -> None:
        for component in self.components:
            check = getattr(component.granularity, "check", None)
            if check:
                check(head_dim, fmt)
