"""The grammar backends (llguidance, xgrammar): every version quirk lives here, one place each."""
