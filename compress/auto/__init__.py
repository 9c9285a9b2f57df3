"""``compress auto``: the most accurate student under a budget, found and measured on this machine: the stage
(``run``), the model-free search core (``search``: budgets, latency model, choice), successive halving on Optuna
(``engine``), the embedding search (``embedding``) and the report (``report``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "auto": "run",
    "AutoConfig": "run",
})
