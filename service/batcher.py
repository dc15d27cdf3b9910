"""Concurrent requests micro-batched into one model call.

Requests wait in one queue; a single worker takes as many as fit in `max_batch` queries (after waiting
`wait_s` for more once the first is there) and runs one search for all of them in a thread of its own,
so the event loop keeps accepting requests while the model works, and the model never runs two calls
at once (each call gets every core). The queue is bounded in queries: a request that would pass
`max_queue` is refused at once (`Overloaded`, a 503), so a burst costs its excess a fast refusal instead
of every request a growing wait. The batch searches with the largest k asked and each request keeps its
own first k: the retriever's candidates do not depend on k (scoring/retriever.py), so a query's top 10
is the same whatever k it, or the requests batched with it, ask for.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class Overloaded(Exception):
    """The queue is full."""


@dataclass
class Pending:
    queries: list[str]
    k: int
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    def __init__(
        self,
        search: Callable[[list[str], int], Any],
        max_batch: int,
        wait_s: float,
        max_queue: int,
        observe: Callable[[int, float], None] = lambda queries, seconds: None,
    ):
        """`search(queries, k)`: one list of hits per query; `observe(queries, seconds)` sees each model call."""
        self.search, self.max_batch, self.wait_s, self.max_queue = search, max_batch, wait_s, max_queue
        self.observe = observe
        self.pending: deque[Pending] = deque()
        self.queued = 0  # queries waiting
        self._wakeup: asyncio.Event | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dssm-serve-model")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="dssm-serve-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for item in self.pending:
            if not item.future.done():
                item.future.set_exception(Overloaded("the service is stopping"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], k: int) -> list:
        """The hits of each query, once a batch has searched them."""
        if self.queued + len(queries) > self.max_queue:
            raise Overloaded(f"{self.queued} queries are waiting (serve.max_queue {self.max_queue})")
        future = asyncio.get_running_loop().create_future()
        self.pending.append(Pending(queries, k, future))
        self.queued += len(queries)
        self._wakeup.set()
        return await future

    def _take(self) -> list[Pending]:
        """The oldest requests that fit in one batch (at least one, whatever its size)."""
        taken, size = [], 0
        while self.pending and (not taken or size + len(self.pending[0].queries) <= self.max_batch):
            item = self.pending.popleft()
            if item.future.done():  # its client went away
                self.queued -= len(item.queries)
                continue
            taken.append(item)
            size += len(item.queries)
        self.queued -= size
        return taken

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            if self.wait_s and self.queued < self.max_batch:
                await asyncio.sleep(self.wait_s)
            batch = self._take()
            if not batch:
                continue
            queries = [q for item in batch for q in item.queries]
            started = time.perf_counter()
            try:
                hits = await loop.run_in_executor(self._executor, self.search, queries, max(i.k for i in batch))
            except Exception as e:  # the model's failure is each request's answer, never the worker's end
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            finally:
                self.observe(len(queries), time.perf_counter() - started)
            start = 0
            for item in batch:
                mine = [found[: item.k] for found in hits[start : start + len(item.queries)]]
                start += len(item.queries)
                if not item.future.done():
                    item.future.set_result(mine)
