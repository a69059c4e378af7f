"""The OpenAI-compatible HTTP server and ``corral serve``.

``create_app(ServerState)`` (``app.py``) builds the FastAPI app; ``build_state(ServerConfig)``
(``server.py``) loads the model, engine and compile service behind it. Requests are validated by
``protocol.py``, turned into constraints by ``response_formats.py`` / ``tools.py``, rendered by
``prompting.py``, run by ``serving_chat.py`` / ``serving_completion.py``; ``errors.py`` is the one
place exceptions become OpenAI-shaped error responses.
"""

from corral.api.config import ServerConfig

__all__ = ["ServerConfig"]
