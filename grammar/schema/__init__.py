"""JSON Schema analysis: checks, `$ref` resolution, and rewrites into a form a backend enforces exactly."""
