"""The base-size teacher (all-mpnet-base-v2) through every stage: its installer and the benchmark `make bench-base`."""
