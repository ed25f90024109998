"""Tests of the repository's benchmarks/ scripts (outside the package)."""
