"""A separate process that uses the cache: ``schema_cache_child.py ROOT [SYNC_DIR [REDIS_URL KEY_FILE]]``.

It gets the constraints of ``schema_cache_helpers.regex_specs(N)``
plus one JSON schema, check each compiled constraint with a real matcher, and print the
service's stats as one JSON line. With SYNC_DIR, write ``SYNC_DIR/ready-<pid>`` once the
tokenizer is loaded and wait for ``SYNC_DIR/go`` before touching the cache, so that several
children can be started at the same moment. With REDIS_URL, the cache has that shared tier,
sealed under KEY_FILE.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from schema_cache_helpers import regex_specs

from corral.fuzz.tokenizers import llama3_tokenizer
from corral.grammar import ConstraintSpec
from corral.schema_cache import CacheConfig, CompileService

N_SPECS = 12
JSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_VALID = '{"name":"Ada","age":36}'


def specs() -> list[tuple[ConstraintSpec, str]]:
    """Each constraint with a text it must accept (regex_specs' pattern is tag i - letters digits)."""
    out = [(s, f"r{i}-abc42") for i, s in enumerate(regex_specs(N_SPECS))]
    out.append((ConstraintSpec.json_schema(JSON_SCHEMA), JSON_VALID))
    return out


def accepts(service: CompileService, spec: ConstraintSpec, text: str) -> bool:
    m = service.get_or_compile(spec).matcher()
    return m.accept_tokens(service.tok.encode(text)) == len(service.tok.encode(text)) and (
        m.can_terminate()
    )


def main() -> None:
    root = Path(sys.argv[1])
    sync = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    redis_url = sys.argv[3] if len(sys.argv) > 3 else None
    key_file = sys.argv[4] if len(sys.argv) > 4 else None
    tok = llama3_tokenizer()
    _ = tok.llguidance
    if sync is not None:
        (sync / f"ready-{os.getpid()}").touch()
        while not (sync / "go").exists():
            time.sleep(0.005)
    config = CacheConfig(root=root, isolation="thread", redis_url=redis_url, key_file=key_file)
    service = CompileService(tok, config)
    ok = all(accepts(service, spec, text) for spec, text in specs())
    service.flush()
    stats = service.stats()
    stats.pop("compile_seconds_recent")
    print(json.dumps({"all_accepted": ok, **stats}))


if __name__ == "__main__":
    main()
