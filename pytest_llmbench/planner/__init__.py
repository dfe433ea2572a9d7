"""The planner: what a model would need and take on hardware nobody ran here, every figure estimated.

    memory       the memory planner: per-device bytes of a step by named term, per strategy and N
    cli          ``llmbench-plan``: the command line over all of it
    steptime     the step-time predictor (operators timed by a device's roofline, NCCL's ring model)
    projection   the report's projection of measured points to larger world sizes, checked by leaving
                 each measured world size out
    predicted    the step-time predictor beside the projection, calibrated by the measured points
    configs      a model as a preset or a Hugging Face config.json, and the strategy table's sends
    validation   the predictor against published training measurements
    terms        the memory planner's types: a model's shape, a named term of bytes, an estimate
    memory_plan  a model's memory plan at a shape: what llmbench-plan prints and the report's "Does it fit?"
    references   the memory references ``--check`` runs, and the one-sided bounds the estimate keeps
    time_cli     ``llmbench-plan --time``: its flags, checks and output
    mfu          the step at a stated MFU (compute at that MFU, the table's traffic over a stated link)
    mfu_cli      ``llmbench-plan --mfu``: its flags' links and output

The device table the predictor reads is harness/devices.py (measured MFU on a rank reads it too).
"""
