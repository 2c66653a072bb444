"""Benchmarks that print their figures as JSON (images/s, MFU, bus bandwidth, scaling)."""
