"""The local launcher: torchrun on this host, fresh for each case or on warm ranks.

    launcher  one torchrun for the case, its ranks' logs, what outlives it killed (``KIND``)
    warm      a pool of warm ranks that serves case after case, and when it is retired
"""
