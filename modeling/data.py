"""Training batches streamed from the Parquet shards of `dssm negatives`.

Every step takes the same number of rows (`per_shard = batch_size / shards`) from every train
shard; rank r of W owns shards r, r+W, ... So the global batch of a step is the same set of rows
whatever the number of ranks, and 1 process and N processes train the same model (tested). No rank
reads another rank's shards. Rows are shuffled within blocks of `shuffle_buffer` rows by a
generator seeded with (seed, epoch, shard), so an epoch's order is reproducible and a resumed run
skips exactly the rows it had already used. An epoch lasts as many steps as the smallest shard
allows; the rows left over in larger shards (a few percent with hash-partitioned shards) are
different ones each epoch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import Tensor

from core.errors import DssmError
from modeling.config import DataConfig
from modeling.hashing import TextBatch, Tokenizer

COLUMNS = ["query", "positive", "negatives", "clicks", "impressions", "debiased_clicks", "shown", "relevance"]
PREFETCH = 2  # batches encoded ahead by the worker process


def train_files(negatives: Path) -> list[Path]:
    files = sorted((Path(negatives) / "train").glob("*.parquet"))
    if not files:
        raise DssmError(f"{negatives}/train: no Parquet shards; run `dssm negatives` first")
    return files


def plan(files: list[Path], batch_size: int, world: int) -> tuple[int, int]:
    """(rows per shard per step, steps per epoch), or a clear error when the shards don't fit."""
    if len(files) % world:
        raise DssmError(
            f"{len(files)} train shards cannot be split evenly over {world} processes; "
            f"rerun `dssm negatives --shards` with a multiple of {world}"
        )
    if batch_size % len(files):
        raise DssmError(f"data.batch_size={batch_size} must be a multiple of the {len(files)} train shards")
    per_shard = batch_size // len(files)
    rows = {f: parquet_file(f).metadata.num_rows for f in files}
    empty = [str(f) for f, n in rows.items() if n < per_shard]
    if empty:
        raise DssmError(
            f"train shard(s) with fewer than {per_shard} rows (one step's share): {', '.join(empty)}; "
            "use a smaller data.batch_size or fewer `dssm negatives --shards`"
        )
    return per_shard, min(rows.values()) // per_shard


def parquet_file(path: Path) -> pq.ParquetFile:
    """An open shard, or an error that names the damaged file."""
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DssmError(f"{path}: not a readable Parquet file ({e}); rebuild it: `dssm negatives --force`") from None


def _shard_rows(path: Path, block: int, rng: np.random.Generator) -> Iterator[tuple]:
    """Rows of COLUMNS, shuffled within blocks."""
    for record_batch in parquet_file(path).iter_batches(batch_size=block, columns=COLUMNS):
        cols = [record_batch.column(c).to_pylist() for c in COLUMNS]
        for i in rng.permutation(record_batch.num_rows):
            yield tuple(col[i] for col in cols)


def shard_chunks(
    path: Path, per_shard: int, steps: int, block: int, seed: int, epoch: int, index: int
) -> Iterator[list]:
    """`steps` shuffled chunks of `per_shard` rows of one shard, the same for the same (seed, epoch)."""
    rows = _shard_rows(path, block, np.random.default_rng([seed, epoch, index]))
    for _ in range(steps):
        yield [next(rows) for _ in range(per_shard)]


@dataclass
class ListTargets:
    """The listwise targets of a batch's rows that carry a list (`loss.listwise`): `rows` (L,) the
    rows, `docs` their shown titles, list after list, `mask` (L, K) which of K slots hold a title
    (a prefix of each row) and `targets` (L, K) each list's relevance, normalised to sum 1."""

    rows: Tensor
    docs: TextBatch
    mask: Tensor
    targets: Tensor

    def to(self, device: torch.device | str) -> ListTargets:
        return ListTargets(self.rows.to(device), self.docs.to(device), self.mask.to(device), self.targets.to(device))


Batch = tuple[TextBatch, TextBatch, Tensor, Tensor, ListTargets | None]


class ClickBatches:
    """This rank's local batches: (queries, docs) TextBatches, docs as [clicked, negatives...] per
    row, row weights, row keys (`row_keys`) and, with `listwise`, the rows' ListTargets (else None)."""

    def __init__(
        self,
        files: list[Path],
        rank: int,
        world: int,
        cfg: DataConfig,
        tokenizer: Tokenizer,
        n_negatives: int,
        seed: int,
        pair_weight: str = "none",
        listwise: bool = False,
    ):
        self.per_shard, self.steps_per_epoch = plan(files, cfg.batch_size, world)
        self.files = list(enumerate(files))[rank::world]
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.n = n_negatives
        self.seed = seed
        self.pair_weight = pair_weight
        self.listwise = listwise
        self.rank = rank

    def epoch(self, epoch: int, skip: int = 0, train: bool = True) -> Iterator[Batch]:
        """The epoch's batches after the first `skip` (which are read but not tokenised)."""
        streams = [
            shard_chunks(f, self.per_shard, self.steps_per_epoch, self.cfg.shuffle_buffer, self.seed, epoch, i)
            for i, f in self.files
        ]
        for step, chunks in enumerate(zip(*streams, strict=True)):
            if step < skip:
                continue
            rows = [row for chunk in chunks for row in chunk]
            rng = np.random.default_rng([self.seed, 1 + self.rank, epoch, step]) if train else None
            yield self.encode(rows, rng)

    def steps(self, start: int, total: int) -> Iterator[Batch]:
        """The training batches of steps `start` + 1 … `total`, across epochs, read and tokenised
        where `data.encode_in` says: in the training step or ahead in a worker process."""
        if self.cfg.encode_in == "process":
            return in_worker_process(self, start, total)
        return self._steps(start, total)

    def _steps(self, start: int, total: int) -> Iterator[Batch]:
        step = start
        while step < total:
            epoch, skip = divmod(step, self.steps_per_epoch)
            for batch in self.epoch(epoch, skip=skip):
                if step >= total:
                    return
                step += 1
                yield batch

    def encode(self, rows: list, rng: np.random.Generator | None = None, lists: bool | None = None) -> Batch:
        """Query and document batches, each row's loss weight (`loss.pair_weight`), its keys
        (`row_keys`) and the rows' ListTargets when `lists` (default: the batches' `listwise`)."""
        docs = []
        for _, positive, negatives, *_ in rows:
            if len(negatives) != self.n:
                raise DssmError(f"a row has {len(negatives)} negatives, the manifest says {self.n}")
            docs.append(positive)
            docs.extend(negatives)
        # Scrambling picks rows, not texts: a row's query and all its titles are shuffled together
        # (Wieting & Gimpel shuffle both sentences of a pair, before the negatives are chosen).
        scrambled = np.zeros(len(rows), bool)
        if rng is not None and self.cfg.scramble > 0:
            scrambled = rng.random(len(rows)) < self.cfg.scramble
        weights = pair_weights(rows, self.pair_weight)
        queries = [r[0] for r in rows]
        drop = self.cfg.word_dropout
        return (
            self.tokenizer.batch(queries, rng, drop, scrambled),
            self.tokenizer.batch(docs, rng, drop, np.repeat(scrambled, 1 + self.n)),
            weights,
            row_keys(rows),
            self.list_targets(rows, rng) if (self.listwise if lists is None else lists) else None,
        )

    def list_targets(self, rows: list, rng: np.random.Generator | None) -> ListTargets | None:
        """The ListTargets of the rows that carry a list; None when none does."""
        listed = [(i, r[6], r[7]) for i, r in enumerate(rows) if r[6]]
        if not listed:
            return None
        width = max(len(shown) for _, shown, _ in listed)
        mask = torch.zeros(len(listed), width, dtype=torch.bool)
        targets = torch.zeros(len(listed), width)
        for j, (_, shown, relevance) in enumerate(listed):
            mask[j, : len(shown)] = True
            targets[j, : len(shown)] = torch.tensor(relevance) / sum(relevance)
        titles = [t for _, shown, _ in listed for t in shown]
        return ListTargets(
            rows=torch.tensor([i for i, _, _ in listed], dtype=torch.int64),
            docs=self.tokenizer.batch(titles, rng, self.cfg.word_dropout),
            mask=mask,
            targets=targets,
        )


class _StepStream(torch.utils.data.IterableDataset):
    def __init__(self, batches: ClickBatches, start: int, total: int):
        self.batches, self.start, self.total = batches, start, total

    def __iter__(self):
        torch.set_num_threads(1)
        return self.batches._steps(self.start, self.total)


def in_worker_process(batches: ClickBatches, start: int, total: int) -> Iterator:
    """`batches.steps` produced up to PREFETCH ahead by one spawned DataLoader worker process (no GIL
    shared with the training step; tensors come back through shared memory)."""
    loader = torch.utils.data.DataLoader(
        _StepStream(batches, start, total),
        batch_size=None,
        num_workers=1,
        prefetch_factor=PREFETCH,
        multiprocessing_context="spawn",
    )
    yield from loader


def text_key(text: str) -> int:
    """A signed 64-bit hash of `text`, the same in every process (Python's hash() is salted per
    process, and ranks compare the keys they gather from each other)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def row_keys(rows: list) -> Tensor:
    """(B, 2) int64: each row's [query key, clicked title key]. Rows that share a query (or a
    clicked title) share its key, so the losses can keep them from serving as each other's
    negatives: the paraphrase objective by query, `loss.mask_in_batch` by either."""
    return torch.tensor([[text_key(r[0]), text_key(r[1])] for r in rows], dtype=torch.int64).reshape(-1, 2)


def pair_weights(rows: list, kind: str) -> Tensor:
    """Per-row loss weights. The rows are distinct clicked pairs, so `none` counts a pair clicked once
    like one clicked a hundred times; `clicks` restores the paper's one-example-per-click weighting;
    `ipw` weighs each click by 1/examination of its rank (the inverse-propensity-weighted loss)."""
    if kind in ("ipw", "log_ipw"):
        debiased = torch.tensor([r[5] for r in rows], dtype=torch.float32)
        return debiased if kind == "ipw" else torch.log1p(debiased)
    clicks = torch.tensor([r[3] for r in rows], dtype=torch.float32)
    if kind == "clicks":
        return clicks
    if kind == "log_clicks":
        return torch.log1p(clicks)
    if kind == "ctr":
        return clicks / torch.tensor([max(r[4], 1) for r in rows], dtype=torch.float32)
    return torch.ones(len(rows))


def validation_rows(negatives: Path, limit: int) -> list:
    """The first `limit` rows of valid/ (fixed, so validation losses are comparable across steps)."""
    rows: list = []
    for f in sorted((Path(negatives) / "valid").glob("*.parquet")):
        for batch in parquet_file(f).iter_batches(batch_size=4096, columns=COLUMNS):
            cols = [batch.column(c).to_pylist() for c in COLUMNS]
            rows.extend(zip(*cols, strict=True))
            if len(rows) >= limit:
                return rows[:limit]
    return rows
