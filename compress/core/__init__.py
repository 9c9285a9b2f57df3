"""Foundation layer: tasks, data, artifacts, model structure and configs.

Nothing in here imports from ``teacher``, ``students``, ``eval`` or the methods.
"""
