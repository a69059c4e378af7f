"""Layer 0: helpers every layer uses (cache paths, lazy exports, worker processes, heap).

It imports nothing of Corral's; every other package may import it."""
