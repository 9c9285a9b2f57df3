"""Evaluation: official GLUE/SQuAD metrics, the evaluate entry point (``evaluate.evaluate``), head analysis,
leaderboards and reports, their options (``config``; timing in ``latency/``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "EvalConfig": "config",
    "analyze_heads": "heads",
    "HeadsConfig": "config",
    "LeaderboardConfig": "config",
})
