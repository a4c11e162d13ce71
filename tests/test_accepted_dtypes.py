"""A format is refused for a release that would refuse its spelling at start (profiles/engines/kv_cache_dtypes.json:
each release's CacheDType, or SGLang's kv_cache_dtype choices, read from its wheel)."""

import pytest

from sizing.engines.accepted_dtypes import accepted_since, dtypes_table
from sizing.errors import KvsizeError
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import estimate
from sizing.profiles import load_model
from sizing.engines.serve import LAUNCHERS

H200_BYTES = 150_109_880_320  # CUDA's total of an H200 (the developers' guide)


def sized(engine: str, kv: str):
    name, shape = load_model("llama-3.1-8b")
    return estimate(Scenario(name, shape, "H200", H200_BYTES, engine=engine, k_cache_dtype=kv, v_cache_dtype=kv,
                             max_model_len=8192))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_spelling_kvsize_writes_is_one_the_engine_lists(engine):
    for fmt, spelling in LAUNCHERS[engine].spelling.items():
        assert accepted_since(engine, spelling) is not None, (fmt, spelling)


@pytest.mark.parametrize("engine, kv, needs", [
    ("vllm@0.24", "int4_per_token_head", "0.25.0"),  # added in 0.25.0's CacheDType
    ("vllm@0.26.0", "ultraquant_4bit", "0.32.0"),
    ("vllm@0.27.1", "nvfp4_4over6", "0.28.0"),
    ("vllm@0.31", "ultraquant_4bit", "0.32.0"),
])
def test_a_format_the_release_does_not_accept_is_refused_naming_the_first_that_does(engine, kv, needs):
    with pytest.raises(KvsizeError, match=rf"does not accept --kv-cache-dtype {kv} \(it came in vllm {needs}"):
        sized(engine, kv)


@pytest.mark.parametrize("engine, kv", [
    ("vllm@0.25.0", "int4_per_token_head"), ("vllm@0.32", "ultraquant_4bit"), ("vllm@0.33.0", "nvfp4_4over6"),
    ("vllm@0.20.0", "fp8_per_token_head"), ("vllm@0.26.0", "fp8"),
    ("vllm@0.17", "fp8"),  # before the checked window: not judged
    ("sglang@0.5.14", "fp8_e4m3"),
])
def test_a_format_the_release_accepts_is_sized(engine, kv):
    assert sized(engine, kv).kv_budget_bytes > 0


def test_every_listed_value_names_a_checked_release():
    for name, row in dtypes_table().engines.items():
        assert set(v.since for v in row.values) <= set(row.checked), name
