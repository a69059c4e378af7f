"""Corral: a structured-generation LLM server.

The subpackages live in the repository's top-level folders and are mapped into this namespace
by ``pyproject.toml``: ``corral.grammar``, ``corral.schema_cache``, ``corral.mask_kernels``,
``corral.engine``, ``corral.api`` and ``corral.fuzz``.
"""

__version__ = "0.1.0"
