"""Each family reader's FIELDS names every config field its readers look up, so the lists stay what names an
unread field: over the corpus, every field a shape was read from is in some family's FIELDS (or read through
the field transformers made of it), and a memory-relevant field is a family's or one no reader reads."""

import json
from pathlib import Path

import pytest

from sizing.config import dense, hybrid, mla, moe, multimodal, nested, quantization, windows
from sizing.config.unread import MEMORY_RELEVANT_FIELDS, NOT_READ, SUBSUMED_BY
from sizing.errors import KvsizeError

FIXTURES = Path(__file__).parent / "fixtures"
CONFIGS = sorted((FIXTURES / "config-corpus").glob("*.json")) + sorted((FIXTURES / "configs").glob("*.json"))
FAMILIES = (dense, windows, mla, moe, hybrid, nested)
READ = {name for family in (*FAMILIES, quantization, multimodal) for name in family.FIELDS}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_field_read_is_in_a_family_list(path):
    from sizing.config import resolve_shape

    try:
        shape = resolve_shape(json.loads(path.read_text()))
    except KvsizeError:
        return
    assert not shape.fields_read - READ - set(SUBSUMED_BY), "read but in no family's FIELDS"


def test_memory_fields_are_fields_a_family_reads_or_none_does():
    for family in FAMILIES:
        assert set(family.MEMORY_FIELDS) <= set(family.FIELDS) & MEMORY_RELEVANT_FIELDS, family.__name__
    assert not set(NOT_READ) & READ
