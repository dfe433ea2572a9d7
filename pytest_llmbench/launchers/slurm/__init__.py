"""The Slurm launcher: a case as a batch job (``sbatch``) or a job step in an allocation (``srun``).

    launcher  the launcher: submit, wait, collect, cancel (``KIND``)
    scripts   the job and step scripts it writes, every value quoted
    jobs      what it asks of Slurm and reads of a job (squeue, sacct, scancel)
    logs      what the case's logs say: progress while it runs, its result after
    values    the ``[slurm]`` profile table and its checks
"""
