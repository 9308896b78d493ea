"""The compare's units on a Dask ``distributed`` cluster (``tsprobe compare --executor dask``).

No address: a ``LocalCluster`` of worker processes (one thread each) on this machine. With
``--scheduler tcp://HOST:PORT`` or ``--scheduler-file FILE``: a running cluster, e.g. one started
on an HPC system by dask-jobqueue (docs/compare.md). Units carry paths: each worker reads its
ranks' files from the shared file system itself. A worker lost mid-compare has its units run
again by the scheduler (Dask reschedules the tasks of a lost worker); a unit that raised is
retried ``RETRIES`` times. Needs ``pip install 'tsprobe[dask]'``; nothing else imports it.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import uuid
from typing import Callable, Optional

RETRIES = 2


def _distributed():
    try:
        import distributed
    except ImportError:
        raise ImportError("tsprobe compare --executor dask needs Dask distributed: "
                          "pip install 'tsprobe[dask]'") from None
    return distributed


class DaskBackend:
    """``submit``/``as_completed``/``close`` over a Dask client (as executor.Pool)."""

    def __init__(self, workers: Optional[int] = None, scheduler: Optional[str] = None,
                 scheduler_file: Optional[str] = None):
        distributed = _distributed()
        if scheduler and scheduler_file:
            raise ValueError("give --scheduler or --scheduler-file, not both")
        self.cluster = None
        if scheduler or scheduler_file:
            self.client = distributed.Client(scheduler, scheduler_file=scheduler_file, timeout="30s")
        else:
            self.cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                    dashboard_address=":0", silence_logs=logging.ERROR)
            self.client = distributed.Client(self.cluster)
        self._as_completed = distributed.as_completed
        self._run = uuid.uuid4().hex[:8]
        if importlib.util.find_spec("bokeh") is not None and "dashboard" in self.client.scheduler_info().get(
                "services", {}):    # without bokeh Dask serves only a page that asks for it
            print(f"tsprobe compare: Dask dashboard {self.client.dashboard_link}", file=sys.stderr)

    def submit(self, fn: Callable, *args):
        unit = args[0]
        return self.client.submit(fn, *args, key=f"tsprobe-{unit.label}-{self._run}", pure=False, retries=RETRIES)

    def as_completed(self, futures):
        return self._as_completed(futures)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


__all__ = ["DaskBackend", "RETRIES"]
