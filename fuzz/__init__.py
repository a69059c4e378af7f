"""``corral fuzz``: schema fuzzing and differential testing of constrained-decoding engines.

Schemas come from corpora (MaskBench, JSON-Schema-Test-Suite, plain files) or a Hypothesis
strategy; targets are in-process engines (Corral, raw llguidance, raw xgrammar), run in supervised
worker processes, or OpenAI-compatible URLs. ``jsonschema`` judges every instance. Entry points:
:func:`corral.fuzz.runner.run_fuzz` and the ``corral fuzz`` command (``corral/cli_fuzz.py``).
"""
