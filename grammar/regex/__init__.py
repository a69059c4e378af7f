"""Regexes: translation into the backends' dialect, automata, and exact algebra (intersection, emptiness)."""
