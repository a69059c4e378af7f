"""Checks at value boundaries that a context-free grammar cannot make (distinct keys, unique items, listed values)."""
