"""The grammar backends (llguidance, xgrammar): every version quirk lives here, one place each
(``quirks``, each tested against the real backend in tests/grammar/test_backend_quirks.py)."""
