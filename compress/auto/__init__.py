"""``compress auto``: the most accurate student under a budget, found and measured on this machine: the stage
(``run``) and its options (``config``), what a search stands on (``targets``: a task or an embedding check), the
latency probe and shortlist (``probe``), successive halving (``halving``, on Optuna: ``engine``), the finalists'
measurement (``finalists``), the model-free search core (``search``: budgets, latency model, choice), the search's
records (``state``), the backends' variants (``variants``), the embedding search's pieces (``embedding``) and the
report (``report``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "auto": "run",
    "AutoConfig": "config",
})
