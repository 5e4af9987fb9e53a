"""kernels.blas.single_threaded_blas: numpy's BLAS on one thread inside, the count restored after, counted
across nested and concurrent uses (threadpoolctl reads the real thread counts back)."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from lazyweights.kernels.blas import single_threaded_blas


def _blas_threads() -> list[int]:
    """numpy's own BLAS (torch, when loaded, brings another that single_threaded_blas leaves alone)."""
    return [i["num_threads"] for i in threadpool_info()
            if i["user_api"] == "blas" and "numpy" in i["filepath"]]


@pytest.fixture
def two_threads():
    np.ones((2, 2)) @ np.ones((2, 2))  # numpy's BLAS loaded
    if not _blas_threads():
        pytest.skip("numpy's BLAS is not one threadpoolctl controls")
    with threadpool_limits(limits=2, user_api="blas"):  # so that a wrong restore (to 1) shows
        yield


def test_one_thread_inside_and_restored_after(two_threads):
    assert _blas_threads() == [2] * len(_blas_threads())
    with single_threaded_blas():
        assert set(_blas_threads()) == {1}
        with single_threaded_blas():
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {1}  # the inner exit does not restore under the outer use
    assert set(_blas_threads()) == {2}


def test_concurrent_uses_are_counted(two_threads):
    a_in, b_in, a_out, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def a():
        with single_threaded_blas():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with single_threaded_blas():
            b_in.set()
            a_out.wait(5)
            seen["after a left"] = set(_blas_threads())

    ts = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert seen["after a left"] == {1}  # b still inside: a's exit must not restore
    assert set(_blas_threads()) == {2}
