"""One real vLLM engine start with dummy weights, in the process `measure.vllm_start` launches.

usage: python -m measure.vllm_child MODEL_DIR CONTEXT ARGS_JSON
CONTEXT is the usage context vLLM sizes its batch defaults by: `serve` (the OpenAI server, as
`vllm serve` starts the engine) or `llm` (the offline `LLM()` class). ARGS_JSON holds EngineArgs
fields. vLLM profiles, sizes its KV cache and prints its own memory lines; the launcher stops the
process once they are out.
"""

from __future__ import annotations

import json
import sys


def _log_non_default_args(engine_args) -> None:
    """The "non-default args" line `vllm serve` prints before it builds the engine (its module moved
    in 0.26)."""
    import importlib

    for module in ("vllm.entrypoints.utils", "vllm.entrypoints.serve.utils.api_utils"):
        try:
            importlib.import_module(module).log_non_default_args(engine_args)
            return
        except (ImportError, AttributeError):
            continue
    print("kvsize-start: this release has no log_non_default_args", flush=True)


def main(argv: list[str]) -> int:
    model_dir, context, args_json = argv[1], argv[2], argv[3]
    kwargs = json.loads(args_json)
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    print(f"kvsize-start: vllm {vllm.__version__} context={context} args={json.dumps(kwargs, sort_keys=True)}",
          flush=True)
    common = dict(model=model_dir, load_format="dummy", skip_tokenizer_init=True, seed=0)
    if context == "llm":
        from vllm import LLM

        LLM(**common, **kwargs)
    else:
        from vllm.v1.engine.llm_engine import LLMEngine

        engine_args = EngineArgs(**common, **kwargs)
        _log_non_default_args(engine_args)
        LLMEngine.from_engine_args(engine_args, usage_context=UsageContext.OPENAI_API_SERVER)
    print("kvsize-start: engine ready", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
