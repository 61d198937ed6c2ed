"""Benchmarks of fusefleet: load generator, pipeline-alone limits, simulated runners and peer comparisons."""
