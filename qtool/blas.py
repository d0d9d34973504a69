"""numpy's BLAS held to one thread where qtool multiplies beside other threads.

numpy's wheels bring OpenBLAS, which spreads every product over all cores and spins its threads
waiting for work. Beside calibrate's worker threads and onnxruntime's, those threads oversubscribe
the cores: on 2 cores under load a 38 x 192 Gram product took 30 ms instead of 0.08 (khmersm's
calibrate 22.5 -> 8.9 s, its export's GPTQ 19.8 -> 6.7 s; the files identical, the arithmetic being
exact or serial). threadpoolctl (scikit-learn's) sets whichever BLAS numpy loaded for the block and
restores it after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def one_thread() -> Iterator[None]:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
