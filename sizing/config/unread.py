"""Naming what the readers pass over. Every top-level key of a config.json and of the language model it nests is
read (in some family's FIELDS, or read through the field transformers makes of it), known not to change memory
(irrelevant.IRRELEVANT, each with its reason), known to change memory but read by no reader (NOT_READ), or
unknown. A memory-relevant field the config sets that no reader looked up for this architecture is named in a
note, and so is each unknown key: nothing is passed over in silence."""

from __future__ import annotations

from .dense import FIELDS as DENSE_READ, MEMORY_FIELDS as DENSE_FIELDS
from .fields import Fields
from .hybrid import FIELDS as HYBRID_READ, MEMORY_FIELDS as HYBRID_FIELDS
from .irrelevant import IRRELEVANT
from .mla import FIELDS as MLA_READ, MEMORY_FIELDS as MLA_FIELDS
from .moe import FIELDS as MOE_READ, MEMORY_FIELDS as MOE_FIELDS
from .multimodal import FIELDS as MULTIMODAL_READ
from .nested import FIELDS as NESTED_READ, MEMORY_FIELDS as NESTED_FIELDS
from .quantization import FIELDS as QUANTIZATION_READ
from .windows import FIELDS as WINDOWS_READ, MEMORY_FIELDS as WINDOWS_FIELDS

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
                                    *NESTED_FIELDS, *SUBSUMED_BY, *NOT_READ})

# Every key some family reader looks up (its FIELDS): built from the readers, so it cannot drift from them
READ_FIELDS = frozenset({*DENSE_READ, *WINDOWS_READ, *MLA_READ, *MOE_READ, *HYBRID_READ, *QUANTIZATION_READ,
                         *MULTIMODAL_READ, *NESTED_READ})
# Every key classified as something other than unknown
KNOWN_FIELDS = frozenset({*READ_FIELDS, *SUBSUMED_BY, *NOT_READ, *IRRELEVANT})


def classify(key: str) -> str:
    """'read', 'irrelevant', 'not read' (changes memory, no reader takes it) or 'unknown'."""
    if key in READ_FIELDS or key in SUBSUMED_BY:
        return "read"
    if key in IRRELEVANT:
        return "irrelevant"
    return "not read" if key in NOT_READ else "unknown"


def unknown_keys(raw_text: dict, raw: dict) -> tuple[str, ...]:
    """The top-level keys of the config and of the language model it nests that kvsize neither reads nor knows
    not to change memory, where the config sets them (a key that is null, false, 0 or empty turns nothing on)."""
    keys = {key for source in (raw, raw_text) for key, value in source.items()
            if key not in KNOWN_FIELDS and not _is_unset(value)}
    return tuple(sorted(keys))


def _is_unset(value: object) -> bool:
    return value is None or value is False or (type(value) in (int, float) and value == 0) or value in ("", [], {})


def unknown_fields_note(raw_text: dict, raw: dict) -> tuple[str, ...]:
    """One note naming each unknown key the config sets."""
    unknown = unknown_keys(raw_text, raw)
    if not unknown:
        return ()
    return (f"config.json sets {', '.join(unknown)}, which kvsize neither reads nor knows not to change memory; "
            "if the engine uses them, what they change is not in its figures",)

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
