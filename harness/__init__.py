"""The training core, started by torchrun on every rank: it imports torch and DeepSpeed, never
pytest, kubernetes or jinja2 (the pod image carries only this folder)."""
