"""The two ways ``corral cache warm`` compiles a schema, both through a request's own path.

A warmed entry is worth something only if a request later hits it: same tokenizer, and the same
constraint after the server closes objects (``open_objects``), wraps it after a think block
(``reasoning_format``) and checks the request limits. So each schema becomes the body a client
would send (``response_format`` of type ``json_schema``) and goes

* to a running server's ``POST /v1/constraints`` (``--url``): the server compiles it into its
  own cache tiers, exactly as for ``/v1/chat/completions``; or
* through ``api.request_constraint.chat_constraint`` in this process, with the settings
  ``corral serve`` would read from the environment, into a ``CompileService`` for the served
  model's tokenizer whose disk store the server reads.

Either way a refusal is the message of the 400 a request would get.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from corral.schema_cache.warm import CompileOne, Refused

if TYPE_CHECKING:
    from corral.api.config import ServerConfig
    from corral.schema_cache import CompileService

PRECOMPILE_PATH = "/v1/constraints"


def warm_body(schema: dict | bool, strict: bool = True) -> dict[str, Any]:
    """The request body that asks for ``schema`` as a chat request's response format."""
    json_schema = {"name": "warm", "schema": schema, "strict": strict}
    return {"response_format": {"type": "json_schema", "json_schema": json_schema}}


def local_compiler(service: CompileService, config: ServerConfig, strict: bool) -> CompileOne:
    """Compile in this process, through the constraint path of a chat request."""
    from pydantic import ValidationError

    from corral.api.errors import ApiError
    from corral.api.protocol import ConstraintRequest
    from corral.api.request_constraint import required_constraint
    from corral.api.schema_forms import SchemaForms
    from corral.api.tool_formats import GENERIC
    from corral.grammar import ConstraintError

    forms = SchemaForms()  # this warm run's, as a server's are its own

    def compile_one(schema: dict | bool) -> str:
        try:
            req = ConstraintRequest.model_validate(warm_body(schema, strict))
            constraint = required_constraint(req, config, GENERIC, forms)  # no tools: format unused
        except ValidationError as e:
            raise Refused(e.errors()[0]["msg"]) from None
        except ApiError as e:
            raise Refused(e.message) from None
        try:
            return service.lookup(constraint.spec).source
        except ConstraintError as e:
            raise Refused(constraint.refused(e).message) from None

    return compile_one


def remote_compiler(
    url: str, api_key: str | None, strict: bool = True, timeout_s: float = 600
) -> CompileOne:
    """Compile in the server at ``url`` (``POST /v1/constraints``)."""
    endpoint = url.rstrip("/").removesuffix("/v1") + PRECOMPILE_PATH
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def compile_one(schema: dict | bool) -> str:
        data = json.dumps(warm_body(schema, strict)).encode()
        req = urllib.request.Request(endpoint, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as answer:
                return json.loads(answer.read())["corral"]["cache"]
        except urllib.error.HTTPError as e:
            message = _error_message(e)
            if e.code == 400:
                raise Refused(message) from None
            raise RuntimeError(f"HTTP {e.code} from {endpoint}: {message}") from None

    return compile_one


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        return json.loads(e.read())["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return e.reason or "no message"
