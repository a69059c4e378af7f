"""The constraint core: specs, the compiler, compiled entries, matchers, errors, versions."""
