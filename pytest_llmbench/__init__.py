"""The pytest plugin and what it drives: options, cases, launchers, the store, gates, the planner
and the report; nothing here imports torch at import time."""
