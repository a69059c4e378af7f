"""ServerConfig: every `corral serve` setting, its flag, its environment variable and its meaning.

One table (`SETTINGS`) drives the command-line flags, the environment variables and the
configuration table in docs/serving.md, so the three cannot drift apart. Precedence: flag, then environment, then
the default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from corral.base.paths import CACHE_DIR_ENV
from corral.engine.serving.config import EngineConfig

_GIB = 1 << 30
_CACHE_URL_SCHEMES = ("redis://", "rediss://", "unix://")


def parse_bytes(text: str) -> int:
    """A memory size: a plain number of GiB (``"2"``, ``"0.5"``) or bytes with a unit.

    ``"512MB"``, ``"2GB"``, ``"1073741824B"`` and ``"1073741824"`` (a number above 1024 is read as
    bytes) are all accepted, so both ``CORRAL_MEMORY_GB=2`` and a byte count work.
    """
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": _GIB, "T": 1 << 40}
    scale = units.get(t[-1:]) if t else None
    number = t[:-1] if scale else t
    try:
        value = float(number)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a memory size; write e.g. 2, 0.5, 512MB or 2GB"
        ) from None
    if scale is None:
        scale = 1 if value > 1024 else _GIB
    size = int(value * scale)
    if size <= 0:
        raise ValueError(f"memory size {text!r} must be positive")
    return size


def parse_bool(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``, ``on``/``off``), any case."""
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean; write true or false")


@dataclass(frozen=True)
class Setting:
    """One configuration entry: field name, flag, environment variable, parser and help."""

    field: str
    flag: str
    env: str
    parse: Callable[[str], Any]
    help: str


@dataclass(frozen=True)
class ServerConfig:
    """How `corral serve` runs; validated on construction.

    ``model`` None serves the embedded SmolLM2-135M-Instruct. ``api_key`` None means no
    authentication. ``memory_bytes`` is the KV-cache budget. ``max_concurrent`` requests decode
    together; up to ``queue_limit`` more wait, and beyond that a request gets a 429.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model: str | None = None
    model_name: str | None = None
    memory_bytes: int = _GIB
    device: str = "cpu"
    dtype: str = "auto"
    quantize: str = "auto"
    gpu_memory_fraction: float = 0.9
    max_concurrent: int = 16
    queue_limit: int = 64
    threads: int | None = None
    mask_threads: int | None = None
    mask_deadline_ms: float = 20.0
    overlap: bool = False
    prefix_cache: bool = True
    cuda_graphs: bool = True
    speculative: bool = True
    cache_dir: str | None = None
    log_level: str = "info"
    open_objects: bool = False
    tool_call_format: str = "auto"
    reasoning_format: str | None = "auto"
    chat_template: str | None = None
    # Limits on what one request may send, each named in its 400 (api/limits.py; docs/serving.md's
    # "Limits" table sets them beside OpenAI's). Measured on SmolLM2's tokenizer (2 CPU cores):
    # llguidance's JSON parser stops at 128 levels of nesting, so a schema document may nest
    # 64 (31 levels of objects in properties); 5,000 required properties compile in 1 s,
    # 10,000 in 3.4 s; an enum of 10,000 strings in 0.1 s.
    max_body_bytes: int = 8 << 20
    max_schema_bytes: int = 1 << 20
    max_schema_depth: int = 64
    max_schema_properties: int = 5000
    max_enum_values: int = 10000
    max_tools: int = 128
    max_n: int = 8
    compile_workers: int = 2
    compile_deadline_s: float = 10.0
    cache_url: str | None = None
    cache_prefetch: bool = True
    cache_key_file: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}")
        if self.max_concurrent < 1:
            raise ValueError(f"max concurrent requests must be >= 1, got {self.max_concurrent}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.queue_limit < 0:
            raise ValueError(f"queue limit must be >= 0, got {self.queue_limit}")
        if self.memory_bytes < 1 << 20:
            raise ValueError(f"memory budget must be at least 1MB, got {self.memory_bytes} bytes")
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ValueError(
                f"GPU memory fraction must be in (0, 1], got {self.gpu_memory_fraction}"
            )
        _ = self.torch_dtype  # an unknown device or dtype is refused here, before anything loads
        _ = self.quantization
        for name in (
            "max_body_bytes",
            "max_schema_bytes",
            "max_schema_depth",
            "max_schema_properties",
            "max_enum_values",
            "max_tools",
            "max_n",
            "compile_workers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.compile_deadline_s > 0:
            raise ValueError(f"compile deadline must be > 0 s, got {self.compile_deadline_s}")
        from corral.api.reasoning import REASONING_NAMES
        from corral.api.tool_formats import FORMAT_NAMES

        if self.tool_call_format not in FORMAT_NAMES:
            raise ValueError(
                f"tool call format must be one of {', '.join(FORMAT_NAMES)}, "
                f"got {self.tool_call_format!r}"
            )
        if self.reasoning_format in ("", None):
            object.__setattr__(self, "reasoning_format", "none")
        if self.reasoning_format not in REASONING_NAMES:
            raise ValueError(
                f"reasoning format must be one of {', '.join(REASONING_NAMES)}, "
                f"got {self.reasoning_format!r}"
            )
        if self.chat_template == "":
            object.__setattr__(self, "chat_template", None)
        if self.chat_template is not None:
            self.chat_template_text()  # an unreadable file is a startup error, not a late one
        if self.api_key == "":
            object.__setattr__(self, "api_key", None)
        if self.cache_url == "":
            object.__setattr__(self, "cache_url", None)
        if self.cache_url is not None and not self.cache_url.startswith(_CACHE_URL_SCHEMES):
            raise ValueError(
                f"cache URL must start with one of {', '.join(_CACHE_URL_SCHEMES)}, "
                f"got {self.cache_url!r}"
            )
        self._check_cache_key()

    def chat_template_text(self) -> str | None:
        """The ``--chat-template`` file's Jinja text (None: use the model's own)."""
        if self.chat_template is None:
            return None
        try:
            with open(self.chat_template, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--chat-template {self.chat_template}: cannot be read ({e})") from e
        if not text.strip():
            raise ValueError(f"--chat-template {self.chat_template}: the file is empty")
        return text

    def _check_cache_key(self) -> None:
        """The key file, when named, must be usable now (not first at a replica's start), and
        the shared Redis tier needs one."""
        if self.cache_key_file == "":
            object.__setattr__(self, "cache_key_file", None)
        if self.cache_key_file is not None:
            from corral.schema_cache.sealing import read_key_file

            read_key_file(self.cache_key_file)  # a KeyFileError (ValueError) says what is wrong
        elif self.cache_url is not None:
            raise ValueError(
                "--cache-url needs --cache-key-file PATH (or $CORRAL_CACHE_KEY_FILE): a key "
                "file every replica reads, which seals the entries they share through Redis so "
                "that whoever can write to Redis cannot make them serve a grammar they did not "
                "compile. Create one with: (umask 077; openssl rand -hex 32 > PATH); see "
                "docs/deployment.md"
            )

    @property
    def torch_device(self):
        """`device` checked against this machine (`engine.device.parse_device`)."""
        from corral.engine.execution.device import parse_device

        return parse_device(self.device)

    @property
    def torch_dtype(self):
        """`dtype` resolved for the device and weights (`engine.device.parse_dtype`)."""
        from corral.engine.execution.device import parse_dtype

        return parse_dtype(self.dtype, self.torch_device, self.quantization != "none")

    @property
    def quantization(self) -> str:
        """`quantize` resolved for the model and device (`engine.assets.resolve_quantize`)."""
        from corral.engine.loading.assets import resolve_quantize

        return resolve_quantize(self.quantize, self.model, self.torch_device)

    def engine_config(self) -> EngineConfig:
        """The engine this server runs: `build_state` builds it from here, and so does
        `bench/engine.py`, so the bench measures the engine `corral serve` runs."""
        return EngineConfig(
            kv_cache_bytes=self.memory_bytes,
            gpu_memory_fraction=self.gpu_memory_fraction,
            max_num_seqs=self.max_concurrent,
            num_threads=self.threads,
            mask_threads=self.mask_threads,
            mask_grace_ms=self.mask_deadline_ms if self.mask_deadline_ms > 0 else None,
            overlap=self.overlap,
            prefix_cache=self.prefix_cache,
            cuda_graphs=self.cuda_graphs,
            speculative=self.speculative,
        )

    @classmethod
    def from_sources(
        cls, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> ServerConfig:
        """Flags (None = not given) over environment variables over the defaults."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for s in SETTINGS:
            if flags.get(s.field) is not None:
                values[s.field] = flags[s.field]
            elif environ.get(s.env):
                try:
                    values[s.field] = s.parse(environ[s.env])
                except ValueError as e:
                    raise ValueError(f"{s.env}={environ[s.env]!r}: {e}") from None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


SETTINGS: tuple[Setting, ...] = (
    Setting("model", "--model", "CORRAL_MODEL", str,
            "Hugging Face model folder or .gguf file; default: the embedded SmolLM2-135M-Instruct"),
    Setting("model_name", "--model-name", "CORRAL_MODEL_NAME", str,
            "the model id clients send and /v1/models lists; default: derived from the path"),
    Setting("host", "--host", "CORRAL_HOST", str, "address to listen on (default 127.0.0.1)"),
    Setting("port", "--port", "CORRAL_PORT", int, "TCP port (default 8000)"),
    Setting("api_key", "--api-key", "CORRAL_API_KEY", str,
            "require `Authorization: Bearer <key>` on /v1/* (default: no key)"),
    Setting("device", "--device", "CORRAL_DEVICE", str,
            "cpu (default), cuda or cuda:N: where the model runs"),
    Setting("dtype", "--dtype", "CORRAL_DTYPE", str,
            "auto (default: bfloat16 on CUDA and for quantized weights on the CPU, else float32), "
            "float32, bfloat16 or float16"),
    Setting("quantize", "--quantize", "CORRAL_QUANTIZE", str,
            "auto (default: a .gguf, the embedded model too, keeps its own 4/8-bit weights on the "
            "CPU; anything else runs unquantized), gguf, none, int4 or int8 (CPU only: matmul "
            "weights quantized at load)"),
    Setting("memory_bytes", "--memory", "CORRAL_MEMORY_GB", parse_bytes,
            "KV-cache memory budget on the CPU: GiB (e.g. 2) or bytes with a unit (512MB); "
            "default 1"),
    Setting("gpu_memory_fraction", "--gpu-memory-fraction", "CORRAL_GPU_MEMORY_FRACTION", float,
            "on CUDA: share of the device's memory for weights, activations and the KV cache, "
            "which gets what the other two leave (default 0.9)"),
    Setting("max_concurrent", "--max-concurrent", "CORRAL_MAX_CONCURRENT", int,
            "requests decoded together (default 16)"),
    Setting("queue_limit", "--queue-limit", "CORRAL_QUEUE_LIMIT", int,
            "requests allowed to wait beyond those; more get 429 + Retry-After (default 64)"),
    Setting("threads", "--threads", "CORRAL_THREADS", int,
            "torch threads for the engine's steps (default: the cores this process may use)"),
    Setting("mask_threads", "--mask-threads", "CORRAL_MASK_THREADS", int,
            "threads that fill grammar masks during the forward pass (default: --threads)"),
    Setting("mask_deadline_ms", "--mask-deadline-ms", "CORRAL_MASK_DEADLINE_MS", float,
            "a constrained row whose mask is not ready this long after the logits sits the "
            "step out and runs again, instead of stalling the batch; 0: wait (default 20)"),
    Setting("overlap", "--overlap", "CORRAL_OVERLAP", parse_bool,
            "true: schedule step n+1 and start the model on it before step n's tokens are "
            "read back and postprocessed (same outputs); default false (no gain measured on "
            "the CPU)"),
    Setting("prefix_cache", "--prefix-cache", "CORRAL_PREFIX_CACHE", parse_bool,
            "true (default): prompts reuse the KV of the prefixes the radix cache holds; false: "
            "every prompt is prefilled whole (a baseline for benches)"),
    Setting("cuda_graphs", "--cuda-graphs", "CORRAL_CUDA_GRAPHS", parse_bool,
            "on CUDA: replay decode steps from CUDA graphs captured per batch-size bucket "
            "(default true; false or --no-cuda-graphs: every step eager); ignored on the CPU"),
    Setting("speculative", "--speculative", "CORRAL_SPECULATIVE", parse_bool,
            "true (default): prompt-lookup speculation (drafts copied from the prompt and "
            "output, verified exactly; same outputs, faster extraction); false or "
            "--no-speculative: off (a request may also send \"speculative\": false)"),
    Setting("cache_dir", "--cache-dir", CACHE_DIR_ENV, str,
            "converted models and compiled constraints (default ~/.cache/corral)"),
    Setting("log_level", "--log-level", "CORRAL_LOG_LEVEL", str,
            "debug, info, warning or error (default info)"),
    Setting("open_objects", "--open-objects", "CORRAL_OPEN_OBJECTS", parse_bool,
            "true: objects whose schema is silent about extra keys may get undeclared "
            "properties; false (default): only the declared ones are generated"),
    Setting("max_body_bytes", "--max-body-bytes", "CORRAL_MAX_BODY_BYTES", parse_bytes,
            "largest request body; larger ones get a 413 before they are read (default 8MB)"),
    Setting("max_schema_bytes", "--max-schema-bytes", "CORRAL_MAX_SCHEMA_BYTES", parse_bytes,
            "largest constraint (a schema, all tools' parameters together, a regex, a grammar, "
            "a choice list) as JSON text (default 1MB)"),
    Setting("max_schema_depth", "--max-schema-depth", "CORRAL_MAX_SCHEMA_DEPTH", int,
            "deepest nesting of JSON objects and arrays in a schema document (default 64)"),
    Setting("max_schema_properties", "--max-schema-properties", "CORRAL_MAX_SCHEMA_PROPERTIES", int,
            "most properties in one schema, all objects together (default 5000)"),
    Setting("max_enum_values", "--max-enum-values", "CORRAL_MAX_ENUM_VALUES", int,
            "most enum values in one schema, all enums together, or choices (default 10000)"),
    Setting("max_tools", "--max-tools", "CORRAL_MAX_TOOLS", int,
            "most tools in one request (default 128)"),
    Setting("max_n", "--max-n", "CORRAL_MAX_N", int,
            "most choices (n) in one request (default 8)"),
    Setting("compile_workers", "--compile-workers", "CORRAL_COMPILE_WORKERS", int,
            "worker processes for risky constraint compiles (default 2)"),
    Setting("compile_deadline_s", "--compile-deadline", "CORRAL_COMPILE_DEADLINE_S", float,
            "seconds a constraint compile may take; past it the request gets a 503 (default 10)"),
    Setting("tool_call_format", "--tool-call-format", "CORRAL_TOOL_CALL_FORMAT", str,
            "how the model writes tool calls: auto (default: from the chat template), hermes, "
            "llama3, mistral, phi4, gemma or corral"),
    Setting("reasoning_format", "--reasoning-format", "CORRAL_REASONING_FORMAT", str,
            "auto (default: from the chat template), none, deepseek-r1 or qwen3: a free <think> "
            "block first, returned as reasoning_content; constraints apply after it"),
    Setting("chat_template", "--chat-template", "CORRAL_CHAT_TEMPLATE", str,
            "a Jinja chat template file used instead of the model's own (the tool-call and "
            "reasoning formats are then detected from it); default: the model's"),
    Setting("cache_url", "--cache-url", "CORRAL_CACHE_URL", str,
            "redis://host:port/db: compiled constraints shared with every replica naming the "
            "same Redis, after memory and disk (default: none; see docs/deployment.md, Scaling out)"),
    Setting("cache_prefetch", "--cache-prefetch", "CORRAL_CACHE_PREFETCH", parse_bool,
            "with --cache-url: load the constraints other replicas compile into memory in the "
            "background, before a request asks for them (default true)"),
    Setting("cache_key_file", "--cache-key-file", "CORRAL_CACHE_KEY_FILE", str,
            "a file holding the key (32+ bytes, mode 600) that compiled constraints on disk and "
            "in Redis are sealed under; an entry not sealed under it is recompiled, never "
            "served. Required with --cache-url (the same file on every replica); default: a key "
            "generated in the cache folder (see docs/deployment.md)"),
)  # fmt: skip
