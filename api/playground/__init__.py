"""The playground: the page `corral serve` serves at `/`, a client of the server's own API.

Its files ship in this package (package data) and are read once when the app is built; nothing
is fetched at run time and the page loads no script from anywhere else (its Content Security
Policy says so). The page talks to the same origin with the same API key (it asks for the key
when ``/playground/config.json`` says the server needs one). What it shows:
[serving.md](../../docs/serving.md#the-playground).
"""

from corral.api.playground.routes import add_playground_routes

__all__ = ["add_playground_routes"]
