"""KV memory: the slot pool, the radix prefix cache, and who owns which slot."""
