"""Which task runner the partition tasks run on: threads on this machine (default), or Dask.

FAULTLINE_DASK_ADDRESS=tcp://scheduler:8786   an existing Dask cluster (its workers need faultline installed
                                              and the same warehouse path mounted)
FAULTLINE_DASK_WORKERS=N                      a LocalCluster of N worker processes on this machine
                                              (FAULTLINE_DASK_THREADS threads each, default 1)
FAULTLINE_WORKERS=N                           the thread runner's size (default 2): each partition holds one
                                              batch of lines (`diagnose_batch_jobs`) in memory
"""

from __future__ import annotations

import os

from prefect.task_runners import ThreadPoolTaskRunner

ADDRESS_ENV, WORKERS_ENV, THREADS_ENV = "FAULTLINE_DASK_ADDRESS", "FAULTLINE_DASK_WORKERS", "FAULTLINE_DASK_THREADS"


def dask(address: str | None = None, workers: int | None = None, threads: int = 1):
    """A prefect-dask DaskTaskRunner on `address`, else on a LocalCluster of `workers` processes."""
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as e:  # a clear error instead of a silent fallback to threads
        raise RuntimeError("faultline: a Dask runner was asked for but prefect-dask is not installed "
                           "(pip install prefect-dask)") from e
    if address:
        return DaskTaskRunner(address=address)
    n = max(1, int(workers or 1))
    # processes, not threads: the rule engine holds the GIL in places; no dashboard on a batch runner
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs={"n_workers": n, "threads_per_worker": max(1, threads), "processes": True,
                                          "dashboard_address": None})


def partition_runner(env: dict | None = None):
    """The runner the environment asks for (the module's doc); threads when it asks for nothing."""
    env = os.environ if env is None else env
    if env.get(ADDRESS_ENV) or env.get(WORKERS_ENV):
        return dask(env.get(ADDRESS_ENV) or None, int(env.get(WORKERS_ENV) or 1), int(env.get(THREADS_ENV) or 1))
    return ThreadPoolTaskRunner(max_workers=max(1, int(env.get("FAULTLINE_WORKERS", "2"))))
