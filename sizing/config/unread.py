"""Naming what the readers pass over: a memory-relevant field the config sets that no reader looked up for
this architecture is named in a note, never passed over in silence."""

from __future__ import annotations

from .dense import MEMORY_FIELDS as DENSE_FIELDS
from .hybrid import MEMORY_FIELDS as HYBRID_FIELDS
from .mla import MEMORY_FIELDS as MLA_FIELDS
from .moe import MEMORY_FIELDS as MOE_FIELDS
from .windows import MEMORY_FIELDS as WINDOWS_FIELDS
from .fields import Fields

# Fields transformers turns into others that kvsize reads (Qwen3.5's full_attention_interval and Gemma 3's
# sliding_window_pattern into layer_types, DeepSeek-V4's compress_ratios into compress_rates by layer type)
SUBSUMED_BY = {"full_attention_interval": "layer_types", "sliding_window_pattern": "layer_types",
               "compress_ratios": "compress_rates"}

# Memory-relevant fields no reader looks up for any architecture: where a config sets one, the note names it.
NOT_READ = ("attention_sinks", "attn_type_list", "cross_attention_layers", "global_attn_every_n_layers",
            "mamba_d_state", "mamba_n_heads", "num_shared_experts", "use_sinks")

# Config fields that change memory in vLLM's or SGLang's model code (the KV cache's layers, heads and windows,
# the experts a token is routed to, shared experts, per-layer types, sinks, indexers, MTP layers, recurrent
# state): each is read, or its presence is named in a note, never passed over in silence.
MEMORY_RELEVANT_FIELDS = frozenset({*DENSE_FIELDS, *WINDOWS_FIELDS, *MLA_FIELDS, *MOE_FIELDS, *HYBRID_FIELDS,
                                    *SUBSUMED_BY, *NOT_READ})


def unread_memory_fields(raw_text: dict, raw: dict, f: Fields) -> tuple[str, ...]:
    """A note naming each memory-relevant field the config sets (not null, 0 or false) that the reader never
    looked up for this architecture."""
    # read through the field transformers made of them
    f.asked |= {name for name, by in SUBSUMED_BY.items() if by in f.asked and f.get(by) is not None}
    asked = set(f.asked)
    present = sorted(name for name in MEMORY_RELEVANT_FIELDS - asked
                     for source in {id(raw_text): raw_text, id(raw): raw}.values()
                     if source.get(name) not in (None, 0, False, [], {}))
    unread = list(dict.fromkeys(present))
    if not unread:
        return ()
    return (f"config.json sets {', '.join(unread)}, which change memory in vLLM or SGLang for some "
            "architectures; kvsize does not read them for this one, so what they change is not in its figures",)
