"""Benchmarks that run Corral and its peers on the same work in the same run and print the ratio.

Each is a module run from the repository root, ``python -m bench.<name>``; running one as a file
would put ``bench/`` first on ``sys.path``, where a module could shadow an installed package.
"""
