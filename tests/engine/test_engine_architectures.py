"""Every architecture beyond Llama against its `transformers` class, on tiny random checkpoints.

Each case is a seeded random model of that architecture (3 layers, 8 query heads over 2 KV heads,
random norms and biases), saved as safetensors and loaded by the engine's own loader. Every
scenario of `engine_helpers.SCENARIOS` (prefill, chunked prefill, decode on a cached prefix as the
radix cache shares it, a batch of mixed lengths) compares the engine's logits at every computed
position with transformers' full forward over the whole sequence:

- float32: max |diff| <= 1e-4 (logits of magnitude ~1-10; observed ~1e-5), 5e-4 for the long
  LongRoPE case, whose attention factor 3 scales every query-key product by 9 (observed 2.7e-4);
- bfloat16: the engine in bfloat16 against the float32 reference, max |diff| <= `BF16_SLACK` times
  transformers' own bfloat16 error on that model (its max |diff| from float32 over a 61-token
  probe, relative to the largest |logit|), times the largest |logit|. Two bfloat16
  implementations round at different places; on these deliberately large random weights
  transformers' own bfloat16 logits are 4-11% of the range off float32, and the engine's are as
  far (measured 3-14% on the probe).

The windows of the sliding-window cases are shorter than the test sequences (up to 61 tokens),
so the windowed masks are exercised on prefill, chunked prefill and decode.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
import transformers
from engine_helpers import (
    SCENARIOS,
    chat,
    make_engine,
    random_seqs,
    reference_logits,
    save_random,
)

from corral.engine import SamplingParams
from corral.engine.execution.model import DecoderModel
from corral.engine.execution.model_config import ModelConfig, UnsupportedModelError
from corral.engine.execution.model_runner import ModelRunner
from corral.engine.loading.assets import load_model
from corral.engine.loading.weights import load_weights_from_folder

VOCAB = 300
ATOL_F32 = 1e-4
ATOL_F32_SHARP = {"phi3-longrope-long-window": 5e-4}  # attention factor 3 (see above)
BF16_SLACK = 2.0
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.2,  # large weights, so logits are far from zero and errors show
    pad_token_id=0,  # some classes default to ids beyond the tiny vocabulary
    bos_token_id=1,
    eos_token_id=2,
)
# Phi-3 derives head_dim from hidden / heads: 128 / 8 = 16, half of it rotated.
PHI3 = {**COMMON, "hidden_size": 128, "partial_rotary_factor": 0.5}


def _longrope(original: int) -> dict:
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.3, 2.1, 3.4],
        "long_factor": [1.5, 2.7, 4.0, 9.0],
        "original_max_position_embeddings": original,
    }


YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,  # 512 / 4
}

CASES = {
    "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**COMMON, head_dim=16)),
    "smollm3-nope-layers": (
        transformers.SmolLM3ForCausalLM,
        transformers.SmolLM3Config(**COMMON, no_rope_layer_interval=2),
    ),
    "smollm3-yarn": (
        transformers.SmolLM3ForCausalLM,
        transformers.SmolLM3Config(**COMMON, no_rope_layers=[1, 1, 0], rope_parameters=YARN),
    ),
    "qwen3-moe": (
        transformers.Qwen3MoeForCausalLM,
        transformers.Qwen3MoeConfig(
            **COMMON,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],  # layer 1 keeps the dense MLP
        ),
    ),
    "gemma3": (
        transformers.Gemma3ForCausalLM,
        transformers.Gemma3TextConfig(
            **COMMON,
            head_dim=16,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=24,
            final_logit_softcapping=30.0,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            },
        ),
    ),
    # max_position_embeddings == original: the short factors, attention factor 1
    "phi3-longrope-short": (
        transformers.Phi3ForCausalLM,
        transformers.Phi3Config(**PHI3, rope_parameters=_longrope(512)),
    ),
    # the served context exceeds the original 2: the long factors (transformers picks them for
    # every sequence longer than 2, which all compared ones are), attention factor 3. (Phi3Config
    # takes the top-level original_max_position_embeddings over the rope parameters' one.)
    "phi3-longrope-long-window": (
        transformers.Phi3ForCausalLM,
        transformers.Phi3Config(
            **PHI3,
            rope_parameters=_longrope(2),
            original_max_position_embeddings=2,
            sliding_window=12,
        ),
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def saved(request, tmp_path_factory):
    cls, config = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    return folder, save_random(cls, config, folder), ATOL_F32_SHARP.get(request.param, ATOL_F32)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def pair(request, saved):
    folder, ref, atol = saved
    dtype = getattr(torch, request.param)
    cfg = ModelConfig.from_folder(folder)
    runner = ModelRunner(load_weights_from_folder(folder, cfg, dtype, "cpu"))
    rel = 0.0
    if dtype == torch.bfloat16:  # transformers' own bfloat16 error on this model
        probe = random_seqs([61], 9, VOCAB)[0]
        want = reference_logits(ref, probe)
        ref_bf16 = reference_logits(copy.deepcopy(ref).to(dtype), probe)
        rel = ((ref_bf16 - want).abs().max() / want.abs().max()).item()
    return runner, ref, rel, atol


def _close_for(rel_bf16: float, atol: float = ATOL_F32):
    def close(got: torch.Tensor, want: torch.Tensor) -> None:
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert want.std() > 0.3, "reference logits too flat to tell models apart"
        diff = (got - want).abs().max().item()
        bound = BF16_SLACK * rel_bf16 * want.abs().max().item() if rel_bf16 else atol
        assert diff <= bound, f"max |logits diff| {diff:.3g} > {bound:.3g}"

    return close


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_logits_match_transformers(pair, scenario):
    runner, ref, rel_bf16, atol = pair
    SCENARIOS[scenario](runner, ref, _close_for(rel_bf16, atol), VOCAB)


def test_each_config_reads_its_architecture(saved):
    folder, ref, _ = saved
    c = ModelConfig.from_folder(folder)
    assert not c.plain  # every case needs the general layer (and no fused C decode step)
    expected = {
        "qwen3": dict(qk_norm=True, head_dim=16),
        # no_rope_layers[i] == 1: layer i uses rope (transformers' naming)
        "smollm3": dict(layer_rope=tuple("global" if u else "none"
                                         for u in getattr(ref.config, "no_rope_layers", ()))),
        "qwen3_moe": dict(qk_norm=True),
        "gemma3_text": dict(layer_windows=(8, None, 8), layer_rope=("local", "global", "local"),
                            sandwich_norms=True, norm_offset=1.0, embed_scale=8.0,
                            hidden_act="gelu_pytorch_tanh", final_logit_softcap=30.0),
        "phi3": dict(rotary_dim=8, head_dim=16),
    }[c.model_type]  # fmt: skip
    for name, value in expected.items():
        assert getattr(c, name) == value, name
    if c.moe is not None:
        assert c.moe.sparse_layers == (True, False, True) and c.moe.top_k == 2
    if c.rope.rope_type == "longrope":
        long = ref.config.original_max_position_embeddings < 512
        factors = ref.config.rope_parameters["long_factor" if long else "short_factor"]
        assert c.rope.ext_factors == tuple(factors)
        assert (c.rope.attention_factor > 1) == long


def test_the_multimodal_gemma3_config_serves_its_text_decoder():
    text = CASES["gemma3"][1]
    cfg = transformers.Gemma3Config(text_config=text.to_dict()).to_dict()
    c = ModelConfig.from_hf_dict(cfg)
    assert c.model_type == "gemma3_text" and c.layer_windows == (8, None, 8)


REFUSED = {
    "attn_logit_softcapping": ("gemma3", {"attn_logit_softcapping": 50.0}),
    "use_sliding_window": ("qwen3", {"use_sliding_window": True}),
    "hidden_act": ("qwen3", {"hidden_act": "relu"}),
    "rope type": ("smollm3-yarn", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}),
    "layer_types": ("gemma3", {"layer_types": ["chunked_attention"] * 3}),
    "model_type": ("qwen3", {"model_type": "qwen3_next"}),
    "eos_token_id": ("smollm3-yarn", {"eos_token_id": 128001}),  # SmolLM3Config's default
}


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_variants_not_implemented_are_refused_by_name(field):
    case, change = REFUSED[field]
    with pytest.raises(UnsupportedModelError, match=field):
        ModelConfig.from_hf_dict({**CASES[case][1].to_dict(), **change})


def test_the_fused_c_decode_step_is_refused_for_other_layers(saved):
    folder, _, _ = saved
    model = load_weights_from_folder(folder, ModelConfig.from_folder(folder), torch.bfloat16, "cpu")
    assert isinstance(model, DecoderModel) and not model.config.plain
    # Before any kernel library is asked for: the model itself refuses the fused step.
    meta = ModelRunner(model).attention.prepare(
        torch.zeros(1, dtype=torch.int64), [torch.zeros(1, dtype=torch.int64)], [1],
        torch.device("cpu"), torch.bfloat16,
    )  # fmt: skip
    assert model._fused_decode(object(), None, meta) is None


@pytest.mark.parametrize(
    "case", ["qwen3", "smollm3-yarn", "qwen3-moe", "gemma3", "phi3-longrope-long-window"]
)
def test_the_engine_serves_each_architecture(case, smollm2_folder, tmp_path):
    """The serving entry point (`load_model` + `Engine`, as `corral serve --model FOLDER` runs
    them) on each architecture with SmolLM2's real tokenizer: a chat prompt decodes greedily to
    the same tokens as transformers' own greedy loop."""
    cls, config = CASES[case]
    config = copy.deepcopy(config)
    config.vocab_size = 49152
    ref = save_random(cls, config, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_folder / name, tmp_path / name)
    model = load_model(str(tmp_path))
    engine = make_engine(model)
    prompt = chat(model, "Name three colours.")
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    tokens = engine.generate([prompt], params)[0][0].token_ids
    engine.close()
    ids = list(prompt)
    for _ in range(6):
        ids.append(int(reference_logits(ref, ids)[-1].argmax()))
    assert tokens == ids[len(prompt) :]


def test_a_multimodal_gemma3_checkpoint_serves_its_language_model(tmp_path):
    # Gemma 3 4B and up: `Gemma3ForConditionalGeneration`, the text decoder under
    # `language_model.`, a vision tower beside it (left unloaded). Text-only prompts. No final
    # soft-capping: transformers' multimodal class does not apply it (Gemma 3 sets none).
    text = {**CASES["gemma3"][1].to_dict(), "final_logit_softcapping": None}
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4,
    )  # fmt: skip
    ref = save_random(transformers.Gemma3ForConditionalGeneration, config, tmp_path)
    cfg = ModelConfig.from_folder(tmp_path)
    runner = ModelRunner(load_weights_from_folder(tmp_path, cfg, torch.float32, "cpu"))
    SCENARIOS["prefill-decode"](runner, ref, _close_for(0.0), VOCAB)


@pytest.mark.parametrize("case", ["gemma3", "qwen3-moe"])
def test_speculation_is_exact_on_windowed_and_routed_layers(case, smollm2_folder, tmp_path):
    """Prompt-lookup drafts verified as extra decode rows, on layers whose attention is windowed
    (shorter than the prompt) or whose MLP is routed: greedy tokens with speculation equal the
    tokens without it, and drafts were proposed (a repetitive prompt, mined by the lookup)."""
    cls, config = CASES[case]
    config = copy.deepcopy(config)
    config.vocab_size = 49152
    save_random(cls, config, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_folder / name, tmp_path / name)
    model = load_model(str(tmp_path))
    # a raw prompt that ends inside its own repetition: the lookup proposes from the first step
    prompt = model.tokenizer.encode("red green blue yellow, " * 20, add_special_tokens=False)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    runs = {}
    for spec in (True, False):
        engine = make_engine(model, speculative=spec)
        (choice,) = engine.generate([prompt], params)[0]
        engine.check_integrity()
        engine.close()
        runs[spec] = choice
    assert runs[True].token_ids == runs[False].token_ids
    assert runs[True].spec_proposed > 0 and runs[False].spec_proposed == 0
