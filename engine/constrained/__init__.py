"""Constrained decoding in the step loop: grammar masks, their deadline, jump-forward, budget closing."""
