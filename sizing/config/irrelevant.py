"""Config keys known not to change memory, each with the reason. With the fields the family readers declare
(their FIELDS) and the memory-relevant ones no reader takes (unread.NOT_READ), this classifies every top-level
key of a config.json and of the language model it nests: read, known not to matter, or unknown (unread.py names
each unknown key in the shape's notes)."""

from __future__ import annotations

# reason -> the keys it covers; IRRELEVANT below is the table by key
_BY_REASON: dict[str, tuple[str, ...]] = {
    "a token id or placeholder: which token means what, not how much memory a layer holds": (
        "audio_token_id", "boa_token_id", "boi_token_id", "boi_token_index", "bos_token_id",
        "decoder_start_token_id", "eoa_token_id", "eoa_token_index", "eoi_token_id", "eoi_token_index",
        "eos_token_id", "forced_bos_token_id", "forced_eos_token_id", "ignore_index", "image_placeholder",
        "image_token_id", "image_token_index", "media_placeholder_token_id", "pad_token_id", "reward_token_id",
        "sep_token_id", "video_placeholder", "video_token_id", "video_token_index", "vision_end_token_id",
        "vision_start_token_id", "vision_token_id"),
    "a generation default (sampling, beams, lengths, outputs): the request's settings, not the model's memory": (
        "bad_words_ids", "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
        "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "length_penalty", "max_length",
        "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams", "num_logits_to_keep",
        "num_return_sequences", "output_attentions", "output_hidden_states", "output_router_logits",
        "output_scores", "remove_invalid_values", "repetition_penalty", "return_dict", "return_dict_in_generate",
        "suppress_tokens", "temperature", "top_k", "top_p", "typical_p", "use_cache"),
    "training only (dropout, initialization, auxiliary losses, freezing, checkpointing): unused at inference": (
        "attention_dropout", "attention_dropout_prob", "attention_probs_dropout_prob", "attn_dropout_prob",
        "aux_loss_alpha", "classifier_dropout", "dropout", "emb_dropout_prob", "emb_pdrop", "embd_pdrop",
        "embed_dropout", "embedding_dropout_prob", "ffn_dropout_prob", "freeze_mm_mlp_adapter",
        "freeze_mm_vision_resampler", "gradient_checkpointing", "hidden_dropout", "hidden_dropout_prob",
        "initializer_range", "input_jitter_noise", "pretraining_tp", "rescale_prenorm_residual", "resid_pdrop",
        "router_aux_loss_coef", "router_jitter_noise", "seq_aux", "tf_legacy_loss", "tune_mm_mlp_adapter",
        "tune_mm_vision_resampler", "unfreeze_mm_vision_tower", "z_loss_weight"),
    "a number inside the arithmetic (norm epsilon, rotary base, scale, softcap, activation, clamp): it changes "
    "values, not the size of any tensor": (
        "activation_function", "apply_query_key_layer_scaling", "apply_residual_connection_post_layernorm",
        "attention_softmax_in_fp32", "attention_value_scale", "attn_logit_softcapping", "compress_rope_theta",
        "dim_model_base", "fp32_residual_connection", "gegelu_limit", "hc_eps", "hc_sinkhorn_iters",
        "hidden_act", "hidden_activation", "indexer_rope_interleave", "initial_context_length", "layer_norm_eps",
        "layer_norm_epsilon", "layernorm_epsilon", "mamba_hidden_act", "moe_router_scaling_factor",
        "mup_attn_multiplier", "mup_embedding_multiplier", "mup_use_scaling", "mup_width_multiplier", "norm_eps",
        "original_rope",
        "projector_hidden_act", "query_pre_attn_scalar", "reorder_and_upcast_attn", "residual_in_fp32",
        "rms_norm_eps", "rope_embedding_base", "rope_interleave", "rope_local_base_freq", "rope_position_scale",
        "rope_theta", "rotary_emb_base", "scale_attn_weights", "scale_depth", "scale_emb", "swa_rope_theta",
        "swiglu_alpha", "swiglu_limit", "time_step_floor", "time_step_limit", "time_step_max", "time_step_min",
        "use_bidirectional_attention", "use_dynamic_ntk", "use_logn_attn", "use_mrope"),
    "expert routing (group limits, scoring, scaling, renormalizing, hash routing): which experts a token "
    "visits, not how many or how large they are": (
        "moe_renormalize", "moe_router_activation_func", "moe_router_dtype", "n_group", "norm_topk_prob",
        "num_expert_group", "num_hash_layers", "routed_scaling_factor", "scoring_func", "topk_group",
        "topk_method", "use_grouped_topk"),
    "a bias or norm switch: vectors of one layer's width, under 0.1% of its weights, and no cache": (
        "add_bias_linear", "add_qkv_bias", "bias",
        "lm_head_bias", "mamba_proj_bias", "mlp_bias", "multimodal_projector_bias", "no_bias", "post_layer_norm",
        "qk_layernorm", "qk_norm_type", "qkv_bias", "rmsnorm", "use_bias", "use_conv_bias", "use_gemma_norm",
        "use_moe_router_bias", "use_qk_norm", "use_qkv_bias", "use_routing_bias"),
    "how transformers or a training framework runs the model (kernel choice, parallel layout, export): vLLM "
    "and SGLang choose their own": (
        "_attn_implementation", "_attn_implementation_autoset", "attn_implementation", "bias_dropout_fusion",
        "cache_implementation", "chunk_size_feed_forward", "ep_size", "moe_shared_expert_overlap", "onnx_safe",
        "torchscript",
        "use_bfloat16", "use_flash_attn", "use_mamba_kernels"),
    "bookkeeping (names, versions, remote-code maps, task labels, tokenizer settings): no tensor": (
        "_from_model_config", "_name_or_path", "auto_map", "finetuning_task", "for_llm_compressor", "id2label",
        "label2id", "max_tokenizer_truncation", "model_max_length", "prefix", "problem_type",
        "task_specific_params", "tokenizer_class", "transformers_version"),
    "image preprocessing (resolutions, tiles, tokens per image, placement): a request's length, which the user "
    "gives as its context, not the model's memory": (
        "candidate_resolutions", "global_view_pos", "image_aspect_ratio", "image_grid_pinpoints",
        "image_seq_length", "img_token_compression_config", "mm_tokens_per_image", "mm_use_im_patch_token",
        "mm_use_im_start_end", "mm_vision_select_feature", "mm_vision_select_layer", "process_image_mode",
        "tile_tag", "use_unified_vision_chunk", "vision_feature_layer",
        "vision_feature_select_strategy", "vision_soft_tokens_per_image"),
    "the precision switches of Qwen (v1)'s remote code: vLLM takes the dtype from torch_dtype, which kvsize "
    "reads": ("bf16", "fp16", "fp32"),
    "the encoder-decoder switches of transformers' base config: a decoder-only model leaves them false or "
    "empty, and the engines build it as one": (
        "add_cross_attention", "is_decoder", "is_encoder_decoder", "pruned_heads", "tie_encoder_decoder"),
    "the sum of qk_nope_head_dim and qk_rope_head_dim, which kvsize reads": ("qk_head_dim",),
    "the Mamba-2 scan's chunk length: how the prefill kernel tiles a sequence (vLLM 0.33 config/model.py "
    "get_mamba_chunk_size feeds only the Mamba-2 attention metadata and its warm-up; SGLang 0.5.23 its scan "
    "metadata and the radix cache's state-tracking interval); the state a sequence holds, SGLang's state slots "
    "and vLLM's cache pages do not depend on it": ("chunk_size", "mamba_chunk_size"),
    "BERT's token-type embedding: a few rows of hidden_size, under 0.01% of the weights": ("type_vocab_size",),
    "Falcon's parallel attention and MLP: the same weights in another order": ("parallel_attn",),
}

IRRELEVANT: dict[str, str] = {key: reason for reason, keys in _BY_REASON.items() for key in keys}
