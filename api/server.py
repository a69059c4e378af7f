"""Build a ServerState from a ServerConfig (model, engine, compile service) and serve it."""

from __future__ import annotations

import logging
import sys
import time

from corral.api.config import ServerConfig
from corral.api.state import ServerState

log = logging.getLogger("corral.api")


def build_state(config: ServerConfig) -> ServerState:
    """Load the model and build the engine and the compile service (no network).

    The main thread runs torch single-threaded: the engine thread is then the only one with an
    OpenMP worker team, which keeps its workers spinning between the step's parallel regions
    (`Engine._bind_threads`; decode steps ran 2x slower with a second team from the load).
    """
    import torch

    torch.set_num_threads(1)
    from corral.api.schema_forms import SchemaForms
    from corral.base.paths import constraints_root
    from corral.engine.loading.assets import load_model
    from corral.engine.serving.async_engine import AsyncEngine
    from corral.grammar import ConstraintSpec, TokenizerInfo
    from corral.grammar.core.runtime import ConstraintRuntime
    from corral.schema_cache import CacheConfig, CompileService

    model = load_model(
        config.model,
        config.torch_dtype,
        config.torch_device,
        cache_dir=config.cache_dir,
        quantize=config.quantization,
    )
    tok = TokenizerInfo.from_hf(
        model.tokenizer, vocab_size=model.vocab_size, eos_token_ids=model.eos_token_ids
    )
    # This server's own state: the constraint runtime of its tokenizer and its schema forms.
    runtime, forms = ConstraintRuntime(tok), SchemaForms()
    # Workers for the risky compiles start in the background now, so the first such
    # constraint does not wait for one.
    cache = CacheConfig(
        root=constraints_root(config.cache_dir),
        prestart_workers=True,
        process_workers=config.compile_workers,
        compile_deadline_s=config.compile_deadline_s,
        redis_url=config.cache_url,
        redis_prefetch=config.cache_prefetch,
        key_file=config.cache_key_file,
    )

    def prepare(spec: ConstraintSpec, published: dict) -> None:  # a prefetched constraint
        runtime.budget_close(spec)  # its closer built before a request needs it
        forms.seed(spec, published)

    compiler = CompileService(tok, cache, prepare=prepare, describe=forms.describe)
    engine = AsyncEngine(
        model,
        config.engine_config(),
        compiler.get_or_compile,
        tokenizer_fingerprint=tok.fingerprint,
    )
    state = ServerState(
        config=config,
        model_name=config.model_name or model.name,
        context_length=model.max_position_embeddings,
        kv_capacity=int(engine.stats()["kv_capacity_tokens"]),
        tokenizer=model.tokenizer,
        engine=engine,
        compile_fn=compiler.alookup,
        compile_stats=compiler.stats,
        runtime=runtime,
        forms=forms,
        created=int(time.time()),
        chat_template=config.chat_template_text() or model.chat_template,
        degraded=compiler.degraded,
    )
    state.extra_shutdown.append(compiler.close)
    return state


def startup_line(state: ServerState) -> str:
    c = state.config
    auth = "API key required" if c.api_key else "no API key"
    return (
        f"Corral serving {state.model_name} (context {state.context_length} tokens, "
        f"{c.torch_device} {str(c.torch_dtype).removeprefix('torch.')}"
        f"{'' if c.quantization == 'none' else ', ' + c.quantization + ' weights'}) "
        f"at http://{c.host}:{c.port}/v1 ({auth}; metrics at /metrics)"
    )


def serve(config: ServerConfig) -> int:
    """Load everything, then run uvicorn until interrupted. Returns an exit status."""
    import uvicorn

    from corral.api.app import create_app
    from corral.base.heap import freeze_startup_heap

    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    t0 = time.monotonic()
    print(
        f"Corral: loading {config.model or 'the embedded SmolLM2-135M-Instruct'} ...",
        file=sys.stderr,
        flush=True,
    )
    state = build_state(config)
    app = create_app(state)
    freeze_startup_heap()  # no full collection walks what start-up loaded (base/heap.py)
    app.state.on_ready = lambda: print(
        startup_line(state) + f" — ready in {time.monotonic() - t0:.1f}s", flush=True
    )
    uvicorn.run(
        app, host=config.host, port=config.port, log_level=config.log_level, access_log=False
    )
    return 0
