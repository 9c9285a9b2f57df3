"""Tasks and their data: the task registry and kinds (``tasks``), located readers of a user's files (``files``),
loading a task's splits from the hub, GLUE/SQuAD folders or files (``sources``, ``glue_squad``, ``data_files``),
their options (``config``), parsing their labels (``labels``), tokenising them (``features``), the task of a run (``resolve``), word-piece
alignment for token classification (``token_data``) and generated data (``synthetic``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "Task": "tasks",
    "get_task": "tasks",
    "user_task": "tasks",
    "TaskData": "config",
    "load_task_data": "sources",
    "load_split": "sources",
    "resolve_task": "resolve",
    "task_of_model": "resolve",
    "read_table": "files",
})
