"""Adapters that put samplechain's samplers inside other libraries (optional extras)."""
