"""The planner: what a model would need and take on hardware nobody ran here, every figure estimated.

    steptime     the step-time predictor (operators timed by a device's roofline, NCCL's ring model)
    devices      its device table: hardware facts only, each with its source
    configs      a model as a preset or a Hugging Face config.json, and the strategy table's sends
    validation   the predictor against published training measurements
    terms        the memory planner's types: a model's shape, a named term of bytes, an estimate
    memory_plan  a model's memory plan at a shape: what llmbench-plan prints and the report's "Does it fit?"
    references   the memory references ``--check`` runs, and the one-sided bounds the estimate keeps
    time_cli     ``llmbench-plan --time``: its flags, checks and output
    mfu          the step at a stated MFU (compute at that MFU, the table's traffic over a stated link)
    mfu_cli      ``llmbench-plan --mfu``: its flags' links and output

The memory planner (pytest_llmbench/plan.py) and the command line (pytest_llmbench/plan_cli.py) are
the planner's other half, still beside the package.
"""
