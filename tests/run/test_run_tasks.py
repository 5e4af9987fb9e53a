"""lazyweights.run.driver.run_tasks: every task once, at most `workers` at a time, taken in order; the
first failure stops the rest and surfaces only after the tasks in flight have finished."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lazyweights.compiler.steps import compile_steps
from lazyweights.core.errors import ExecutionError
from lazyweights.graph import ops
from lazyweights.run.driver import BlockTask, run_tasks

STEP = compile_steps({"t": ops.cast(ops.const(np.zeros((64, 4), np.float32)), "float16")})[0]


def tasks(n):
    return [BlockTask(STEP, range(i, i + 1)) for i in range(n)]


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_every_task_once_at_most_workers_at_once_in_order(workers):
    lock = threading.Lock()
    running, peak, started, threads = [0], [0], [], set()

    def run_one(task):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            started.append(task.rows.start)
            threads.add(threading.get_ident())
        time.sleep(0.002)
        with lock:
            running[0] -= 1
        return 1

    run_tasks(tasks(40), run_one, scheduler="threads", workers=workers)
    assert sorted(started) == list(range(40))
    assert peak[0] <= workers and len(threads) <= workers
    # Taken in order: each task starts no later than `workers` places after its turn.
    assert all(abs(pos - i) < workers for pos, i in enumerate(started))
    if workers > 1:
        assert peak[0] > 1  # really parallel


def test_first_failure_waits_for_tasks_in_flight_and_skips_the_rest():
    finished, started = [], []
    gate = threading.Event()

    def run_one(task):
        i = task.rows.start
        started.append(i)
        if i == 0:
            gate.wait(5)  # in flight when task 1 fails
            time.sleep(0.05)
            finished.append(i)
            return 1
        if i == 1:
            gate.set()
            raise ValueError("injected")
        return 1

    with pytest.raises(ExecutionError, match="injected") as e:
        run_tasks(tasks(50), run_one, scheduler="threads", workers=2)
    assert e.value.tensor == "t"
    assert finished == [0], "the failing call returned before the block in flight finished"
    assert len(started) < 50, "tasks after the failure were still started"


def test_main_thread_works_too():
    seen = set()
    run_tasks(tasks(8), lambda t: seen.add(threading.get_ident()) or 1, scheduler="threads", workers=1)
    assert seen == {threading.get_ident()}
