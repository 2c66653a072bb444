"""Reading many files in order with a few threads, a bounded number ahead of the consumer.

Per-file latency (FSx, S3-backed mounts, network disks) dominates reading small images and fields of
view; a few threads hide it while decoding overlaps. At most `ahead` results wait in memory, and
closing the generator (a bad file under a `fail` policy, an interrupt) cancels the reads not yet
started instead of finishing the whole list.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def read_in_order(read: Callable[[Item], Result], items: Iterable[Item], *, threads: int,
                  ahead: int) -> Iterator[Result]:
    """`read(item)` for every item, in the items' order, by `threads` threads at most `ahead` ahead.
    `read` returns its failures rather than raising them, so that the consumer decides."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: deque[Future] = deque()
        try:
            for item in items:
                pending.append(pool.submit(read, item))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
