"""Benchmarks of chtxn on the embedded stack: they measure and report, they never assert a speed."""
