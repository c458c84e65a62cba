"""Benchmarks for omnitrio and the peer runtime: they print figures and write results, never assert timings."""
