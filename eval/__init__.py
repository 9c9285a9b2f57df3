"""Evaluation: official GLUE/SQuAD metrics, the evaluate entry point, latency, analysis and reports."""
