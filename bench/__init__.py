"""Real-data benchmarks; results are committed under bench/results/."""
