"""Training batches from the Parquet shards of `dssm negatives`, tokenised once (modeling/tokens.py).

Every step takes the same number of rows (`per_shard = batch_size / shards`) from every train
shard; rank r of W owns shards r, r+W, ... So the global batch of a step is the same set of rows
whatever the number of ranks, and 1 process and N processes train the same model (tested). Rows are
shuffled within blocks of `shuffle_buffer` rows by a generator seeded with (seed, epoch, shard), so an
epoch's order is reproducible and a resumed run skips exactly the rows it had already used. An epoch
lasts as many steps as the smallest shard allows; the rows left over in larger shards (a few percent
with hash-partitioned shards) are different ones each epoch.

A step's batch is gathered from integer arrays (text ids, then their tokens) by numpy alone, in the
step or ahead in a worker process (`data.encode_in`), whose batches a GPU run receives in page-locked
memory and copies to the device without waiting.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.errors import DssmError
from modeling.config import DataConfig
from modeling.hashing import TextBatch, text_batch
from modeling.tokens import Rows, Tokenised, parquet_file

PREFETCH = 4  # batches built ahead by each worker process


def train_files(negatives: Path) -> list[Path]:
    files = sorted((Path(negatives) / "train").glob("*.parquet"))
    if not files:
        raise DssmError(f"{negatives}/train: no Parquet shards; run `dssm negatives` first")
    return files


def plan(files: list[Path], batch_size: int, world: int, rows: list[int] | None = None) -> tuple[int, int]:
    """(rows per shard per step, steps per epoch), or a clear error when the shards don't fit; `rows`:
    each file's rows where known (default: read from the files' footers)."""
    if len(files) % world:
        raise DssmError(
            f"{len(files)} train shards cannot be split evenly over {world} processes; "
            f"rerun `dssm negatives --shards` with a multiple of {world}"
        )
    if batch_size % len(files):
        raise DssmError(f"data.batch_size={batch_size} must be a multiple of the {len(files)} train shards")
    per_shard = batch_size // len(files)
    counts = rows if rows is not None else [parquet_file(f).metadata.num_rows for f in files]
    empty = [str(f) for f, n in zip(files, counts, strict=True) if n < per_shard]
    if empty:
        raise DssmError(
            f"train shard(s) with fewer than {per_shard} rows (one step's share): {', '.join(empty)}; "
            "use a smaller data.batch_size or fewer `dssm negatives --shards`"
        )
    return per_shard, min(counts) // per_shard


def shard_order(rows: int, block: int, seed: int, epoch: int, index: int) -> np.ndarray:
    """The order an epoch reads shard `index`'s rows in: shuffled within blocks of `block` rows, the
    same for the same (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch, index])
    return np.concatenate([start + rng.permutation(min(block, rows - start)) for start in range(0, rows, block)])


@dataclass
class ListTargets:
    """The listwise targets of a batch's rows that carry a list (`loss.listwise`): `rows` (L,) the
    rows, `docs` their shown titles, list after list, `mask` (L, K) which of K slots hold a title
    (a prefix of each row) and `targets` (L, K) each list's relevance, normalised to sum 1."""

    rows: Tensor
    docs: TextBatch
    mask: Tensor
    targets: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ListTargets:
        moved = (t.to(device, non_blocking=non_blocking) for t in (self.rows, self.docs, self.mask, self.targets))
        return ListTargets(*moved)

    def pin_memory(self) -> ListTargets:
        return ListTargets(
            self.rows.pin_memory(), self.docs.pin_memory(), self.mask.pin_memory(), self.targets.pin_memory()
        )


Batch = tuple[TextBatch, TextBatch, Tensor, Tensor, ListTargets | None]


class ClickBatches:
    """This rank's local batches: (queries, docs) text batches (TextBatch, or TokenBatch for a
    transformer), docs as [clicked, negatives...] per row, row weights, row keys (`row_keys`) and,
    with `listwise`, the rows' ListTargets (else None).

    `data.negatives_per_row` = k scores the first k of each row's n sampled negatives (-1: all);
    validation always scores all n (`valid`), so its loss stays comparable across settings."""

    def __init__(
        self,
        tokenised: Tokenised,
        files: list[Path],
        rank: int,
        world: int,
        cfg: DataConfig,
        n_negatives: int,
        seed: int,
        pair_weight: str = "none",
        listwise: bool = False,
    ):
        sizes = np.diff(tokenised.train.shard_starts).tolist()
        if len(sizes) != len(files):
            raise DssmError(f"the tokenised negatives ({tokenised.path}) do not hold the rows of {files[0].parent}")
        self.per_shard, self.steps_per_epoch = plan(files, cfg.batch_size, world, sizes)
        self.tokenised = tokenised
        self.shards = list(range(len(files)))[rank::world]
        self.cfg = cfg
        self.n = n_negatives
        self.k = n_negatives if cfg.negatives_per_row < 0 else cfg.negatives_per_row
        if self.k > n_negatives:
            raise DssmError(f"data.negatives_per_row={self.k}, but the negatives carry {n_negatives} per row")
        self.seed = seed
        self.pair_weight = pair_weight
        self.listwise = listwise
        self.rank = rank

    def epoch(self, epoch: int, skip: int = 0, stop: int | None = None, keep=None) -> Iterator[Batch]:
        """The epoch's training batches after the first `skip` (and before step `stop`; with `keep`,
        those of the steps s it keeps, `keep(s)`)."""
        rows, steps = self.tokenised.train, self.steps_per_epoch
        starts = rows.shard_starts
        order = [
            starts[i] + shard_order(int(starts[i + 1] - starts[i]), self.cfg.shuffle_buffer, self.seed, epoch, i)
            for i in self.shards
        ]
        # (steps, rows of the step): each shard's `per_shard` rows of the step, shard after shard
        index = np.stack([o[: steps * self.per_shard].reshape(steps, self.per_shard) for o in order], 1)
        index = index.reshape(steps, -1)
        for step in range(skip, steps if stop is None else stop):
            if keep is None or keep(step):
                rng = np.random.default_rng([self.seed, 1 + self.rank, epoch, step])
                yield self.batch(rows, index[step], rng, self.k, self.listwise)

    def steps(self, start: int, total: int, workers: int = 0, pin: bool = False) -> Iterator[Batch]:
        """The training batches of steps `start` + 1 … `total`, across epochs, built in the training
        step or, with `workers` > 0, ahead in that many worker processes (`pin`: into page-locked memory)."""
        if workers:
            return in_worker_processes(self, start, total, workers, pin)
        return self._steps(start, total)

    def _steps(self, start: int, total: int, worker: int = 0, workers: int = 1) -> Iterator[Batch]:
        """Steps `start` + 1 … `total`; with `workers` > 1, only every workers-th of them from the
        `worker`-th on (each worker process builds its share; the loader interleaves them in order)."""
        per_epoch, step = self.steps_per_epoch, start
        while step < total:
            epoch, skip = divmod(step, per_epoch)
            stop = min(per_epoch, total - epoch * per_epoch)
            yield from self.epoch(epoch, skip, stop, lambda s, e=epoch: (e * per_epoch + s - start) % workers == worker)
            step = epoch * per_epoch + stop

    def valid(self, limit: int) -> Iterator[tuple[int, Batch]]:
        """(rows, batch) over the first `limit` validation rows, `batch_size` at a time: unweighted,
        without lists, every sampled negative scored (fixed, so losses compare across steps and runs)."""
        rows = self.tokenised.valid
        size = max(1, self.cfg.batch_size)
        for start in range(0, min(limit, len(rows)), size):
            index = np.arange(start, min(start + size, limit, len(rows)))
            yield len(index), self.batch(rows, index, None, self.n, False)

    def batch(self, rows: Rows, index: np.ndarray, rng: np.random.Generator | None, k: int, lists: bool) -> Batch:
        """Rows `index` of `rows`: query and document batches (clicked title and the first `k`
        negatives of each row), each row's loss weight (`loss.pair_weight`), its keys (`row_keys`)
        and, with `lists`, the rows' ListTargets."""
        queries = rows.query[index]
        docs = np.concatenate([rows.positive[index, None], rows.negatives[index, :k]], 1).reshape(-1)
        # Scrambling picks rows, not texts: a row's query and all its titles are shuffled together
        # (Wieting & Gimpel shuffle both sentences of a pair, before the negatives are chosen).
        scrambled = None
        if rng is not None and self.cfg.scramble > 0:
            scrambled = rng.random(len(index)) < self.cfg.scramble
        return (
            self.texts(queries, rng, scrambled),
            self.texts(docs, rng, None if scrambled is None else np.repeat(scrambled, 1 + k)),
            pair_weights(rows, index, self.pair_weight),
            row_keys(self.tokenised.texts.keys, queries, rows.positive[index]),
            self.list_targets(rows, index, rng) if lists else None,
        )

    def texts(self, tids: np.ndarray, rng: np.random.Generator | None, scrambled: np.ndarray | None = None):
        """The batch of texts `tids` in the encoder's form: word-hashed (TextBatch) or word pieces (TokenBatch)."""
        table = self.tokenised.texts
        if table.pieces is not None:
            from modeling.transformer import token_batch

            return token_batch(table, tids)
        return text_batch(table, tids, rng, self.cfg.word_dropout, scrambled)

    def list_targets(self, rows: Rows, index: np.ndarray, rng: np.random.Generator | None) -> ListTargets | None:
        """The ListTargets of the rows that carry a list; None when none does."""
        listed = np.flatnonzero(rows.shown.lengths(index))
        if not len(listed):
            return None
        lengths, titles = rows.shown.take(index[listed])
        _, relevance = rows.relevance.take(index[listed])
        slot = np.arange(len(titles)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        row = np.repeat(np.arange(len(listed)), lengths)
        mask = np.zeros((len(listed), int(lengths.max())), bool)
        mask[row, slot] = True
        targets = np.zeros(mask.shape, np.float32)
        targets[row, slot] = relevance / np.bincount(row, weights=relevance, minlength=len(listed))[row]
        return ListTargets(
            rows=torch.from_numpy(listed.astype(np.int64)),
            docs=self.texts(titles, rng),
            mask=torch.from_numpy(mask),
            targets=torch.from_numpy(targets),
        )


class _StepStream(torch.utils.data.IterableDataset):
    def __init__(self, batches: ClickBatches, start: int, total: int):
        self.batches, self.start, self.total = batches, start, total

    def __iter__(self):
        torch.set_num_threads(1)
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.batches._steps(self.start, self.total, worker, workers)


def in_worker_processes(batches: ClickBatches, start: int, total: int, workers: int, pin: bool = False) -> Iterator:
    """`batches.steps` produced up to PREFETCH ahead by each of `workers` spawned DataLoader worker
    processes, worker k building steps k, k + workers, ... and the loader taking them in turn, so in
    order (no GIL shared with the training step; tensors come back through shared memory, and with
    `pin` are copied into page-locked memory by the loader's pinning thread)."""
    loader = torch.utils.data.DataLoader(
        _StepStream(batches, start, total),
        batch_size=None,
        num_workers=workers,
        prefetch_factor=PREFETCH,
        multiprocessing_context="spawn",
        pin_memory=pin,
    )
    yield from loader


def row_keys(keys: np.ndarray, queries: np.ndarray, clicked: np.ndarray) -> Tensor:
    """(B, 2) int64: each row's [query key, clicked title key] (`core.array_cache.text_key`). Rows that
    share a query (or a clicked title) share its key, so the losses can keep them from serving as each
    other's negatives: the paraphrase objective by query, `loss.mask_in_batch` by either."""
    return torch.from_numpy(np.stack([keys[queries], keys[clicked]], 1))


def pair_weights(rows: Rows, index: np.ndarray, kind: str) -> Tensor:
    """Per-row loss weights. The rows are distinct clicked pairs, so `none` counts a pair clicked once
    like one clicked a hundred times; `clicks` restores the paper's one-example-per-click weighting;
    `ipw` weighs each click by 1/examination of its rank (the inverse-propensity-weighted loss)."""
    if kind in ("ipw", "log_ipw"):
        debiased = rows.debiased_clicks[index]
        return torch.from_numpy(debiased if kind == "ipw" else np.log1p(debiased))
    clicks = rows.clicks[index]
    if kind == "clicks":
        return torch.from_numpy(clicks)
    if kind == "log_clicks":
        return torch.from_numpy(np.log1p(clicks))
    if kind == "ctr":
        return torch.from_numpy(clicks / np.maximum(rows.impressions[index], 1))
    return torch.ones(len(index))
