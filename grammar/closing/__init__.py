"""Closing: shortest valid completions of a partial output (budget closing, structural tags)."""
