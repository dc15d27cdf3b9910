"""Models, word hashing, loss and optimiser schedule on tiny inputs (no training run)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from conftest import free_port

from core.array_cache import text_key
from core.errors import DssmError
from modeling.config import LossConfig, ModelConfig, OptimConfig, TrainJob, load_config
from modeling.data import ListTargets, pair_weights, row_keys
from modeling.encoders import ENCODERS, build_encoder, tokenizer_for
from modeling.hashing import Tokenizer, Vocab
from modeling.model import TwoTower, click_loss, listwise_loss, training_loss
from modeling.optim import momentum_at, set_schedule
from modeling.tables import HashingTable, TableRows, momentum_runs
from modeling.tokens import Ragged, Rows

TEXTS = ["cordless drill", "white steel ladder with 2 pack", "rug", "outdoor led lamp for home", "zzqx sink"]


@pytest.fixture(scope="module")
def tokenizer(tiny_data) -> Tokenizer:
    return Tokenizer(Vocab.load(tiny_data / "vocab"), max_words=40)


def tiny_cfg(encoder: str, **kw) -> ModelConfig:
    return ModelConfig(**{"encoder": encoder, "ncell": 6, "hidden": [7], "out_dim": 5, **kw})


def lstm_reference(enc, ids_per_word: list[list[int]]) -> torch.Tensor:
    """Eq. (2) written out for one text, word by word (forward direction of `enc.forward_rnn`)."""
    r = enc.forward_rnn
    h = r.hidden
    y = torch.zeros(h, dtype=torch.float64)
    c = torch.zeros(h, dtype=torch.float64)
    w = r.bag.weight.double()
    for ids in ids_per_word:
        z = w[ids].sum(0)[: r.gates * h] + r.bias.double() + r.w_rec.double() @ y
        parts = list(z.split(h))
        if r.forget_gate:
            i, f, o, g = parts
        else:
            (i, o, g), f = parts, None
        if r.peep is not None:
            i = i + r.peep[0].double() * c
            f = None if f is None else f + r.peep[1].double() * c
        c = (torch.sigmoid(f) * c if f is not None else c) + torch.sigmoid(i) * torch.tanh(g)
        if r.peep is not None:
            o = o + r.peep[2].double() * c
        y = torch.sigmoid(o) * torch.tanh(c)
    return y


def test_word_hashing_maps_unknown_trigrams_to_zero(tokenizer):
    (ids,) = tokenizer.trigrams("zzqx")
    assert ids.tolist() == [0, 0, 0, 0]  # #zz zzq zqx qx#: none in the vocabulary
    batch = tokenizer.batch(["cordless drill", "", "drill"])
    assert batch.lengths.tolist() == [2, 1, 1]  # an empty text is one empty word (a zero vector)
    assert len(batch.offsets) == 3  # distinct words: "", cordless, drill
    assert batch.words[0] != batch.words[1] and batch.words[1] == batch.words[3]
    cordless = batch.ids[batch.offsets[batch.words[0]] :][: len("#cordless#") - 2]
    assert cordless.tolist() == [
        tokenizer.vocab.index.get(t, 0) for t in ["#co", "cor", "ord", "rdl", "dle", "les", "ess", "ss#"]
    ]


def random_words(n: int, length: int, seed: int = 0) -> list[str]:
    letters = np.random.default_rng(seed).integers(ord("a"), ord("z") + 1, size=(n, length), dtype=np.uint8)
    return [row.tobytes().decode("ascii") for row in letters]


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_tokenizer_caches_stay_bounded_under_10000_distinct_long_words(tokenizer):
    """Issue 41: a served model kept every distinct word it was sent (437 MB -> 906 MB in 400 requests)."""
    # In memory, with the default bound: resident size grows by much less than the words sent (10 MB
    # of text; the unbounded caches kept their 10 M trigram ids, over 80 MB).
    served = Tokenizer(tokenizer.vocab, max_words=40)
    words = random_words(10_000, 1000, seed=1)
    before = rss_bytes()
    for start in range(0, len(words), 100):  # as served: a request of 100 one-word queries at a time
        served.batch(words[start : start + 100])
    grown = rss_bytes() - before
    assert grown < 30 * 2**20, f"RSS grew {grown / 2**20:.0f} MB"

    from core.text import word_trigrams
    from modeling.hashing import CACHED_WORD_CHARS, MAX_WORD_TRIGRAMS

    bounded = Tokenizer(tokenizer.vocab, max_words=40, cache_size=1000)
    words = random_words(10_000, 1000)
    for start in range(0, len(words), 100):
        bounded.batch(words[start : start + 100])
        cached = bounded.cached()
        assert cached["words"] <= 1000 and cached["texts"] <= 1000, cached
    # a long word is read up to its first MAX_WORD_TRIGRAMS trigrams, and never kept as a cache key
    assert all(len(w) <= CACHED_WORD_CHARS for w in bounded._word_ids)
    (ids,) = bounded.trigrams(words[0])
    assert ids.tolist() == [tokenizer.vocab.index.get(t, 0) for t in word_trigrams(words[0])[:MAX_WORD_TRIGRAMS]]
    # short words are still cached and read whole
    short = [t.tolist() for t in bounded.trigrams("cordless drill")]
    assert short == [t.tolist() for t in tokenizer.trigrams("cordless drill")] and bounded._word_ids


def decoded(batch) -> list[list[list[int]]]:
    """Per text, per word, the trigram ids a TextBatch holds."""
    ends = [*batch.offsets.tolist()[1:], len(batch.ids)]
    bags = [batch.ids[a:b].tolist() for a, b in zip(batch.offsets.tolist(), ends, strict=True)]
    words = iter(batch.words.tolist())
    return [[bags[next(words)] for _ in range(n)] for n in batch.lengths.tolist()]


def test_threads_tokenising_at_once_get_their_own_words_while_the_caches_empty(tokenizer):
    """`mlflow models serve` runs predict in a thread pool: one thread emptying the caches must not
    renumber the words of another's batch."""
    from concurrent.futures import ThreadPoolExecutor

    shared = Tokenizer(tokenizer.vocab, max_words=40, cache_size=50)
    requests = [[" ".join(random_words(3, 6, seed=100 * r + i)) for i in range(20)] for r in range(200)]

    def tokenise(texts: list[str]) -> bool:
        expected = [[tokenizer.vocab.word_tokens(w).tolist() for w in t.split()] for t in texts]
        return decoded(shared.batch(texts)) == expected

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(tokenise, requests))


def test_a_query_is_read_to_max_words_words_within_max_text_chars(tokenizer):
    from core.text import MAX_TEXT_CHARS
    from modeling.hashing import MAX_WORD_TRIGRAMS

    huge = " ".join(random_words(20_000, 5))  # 120,000 characters
    assert tokenizer.words(huge) == huge.split()[:40]
    assert tokenizer.words("x" * 100_000) == ["x" * MAX_TEXT_CHARS]  # one word, cut where reading stops
    batch = tokenizer.batch([huge, "y" * 100_000])
    assert batch.lengths.tolist() == [40, 1] and len(batch.ids) <= 41 * MAX_WORD_TRIGRAMS
    assert tokenizer.words("  two   words  ") == ["two", "words"] and tokenizer.words("") == [""]


@pytest.mark.parametrize("forget_gate,peepholes", [(False, False), (True, False), (True, True), (False, True)])
def test_lstm_matches_equation_2_and_ignores_padding(tokenizer, forget_gate, peepholes):
    torch.manual_seed(0)
    enc = build_encoder(tokenizer.vocab.size, tiny_cfg("lstm", forget_gate=forget_gate, peepholes=peepholes))
    if enc.forward_rnn.peep is not None:
        torch.nn.init.normal_(enc.forward_rnn.peep)
    batch = tokenizer.batch(TEXTS)
    together = enc(batch)
    for j, text in enumerate(TEXTS):
        alone = enc(tokenizer.batch([text]))[0]
        torch.testing.assert_close(together[j], alone, atol=1e-6, rtol=1e-5)
        words = tokenizer.trigrams(text)
        torch.testing.assert_close(
            together[j].double(), lstm_reference(enc, [w.tolist() for w in words]), atol=1e-5, rtol=1e-4
        )


@pytest.mark.parametrize("encoder", ENCODERS)
def test_every_encoder_is_independent_of_the_other_texts_in_the_batch(tokenizer, encoder):
    torch.manual_seed(0)
    if ENCODERS[encoder].transformer:  # its own word pieces; a tiny random configuration
        cfg = tiny_cfg(encoder, pretrained=False, ncell=16, max_tokens=16)
    else:
        cfg = tiny_cfg(encoder)
    tok = tokenizer_for(cfg, tokenizer.vocab)
    enc = build_encoder(tokenizer.vocab.size, cfg).eval()
    together = enc(tok.batch(TEXTS))
    assert together.shape == (len(TEXTS), enc.dim)
    for j, text in enumerate(TEXTS):
        torch.testing.assert_close(together[j], enc(tok.batch([text]))[0], atol=1e-6, rtol=1e-5)


def test_bilstm_backward_direction_reads_the_text_reversed(tokenizer):
    torch.manual_seed(0)
    enc = build_encoder(tokenizer.vocab.size, tiny_cfg("bilstm"))
    vec = enc(tokenizer.batch(["outdoor led lamp"]))[0]
    words = [w.tolist() for w in tokenizer.trigrams("outdoor led lamp")]
    backward = enc.backward_rnn
    enc.forward_rnn, enc.backward_rnn = backward, enc.forward_rnn  # reference reads forward_rnn
    expected = lstm_reference(enc, words[::-1])
    torch.testing.assert_close(vec[6:].double(), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "encoder,kw",
    [("lstm", {}), ("lstm", {"forget_gate": True}), ("rnn", {}), ("gran", {}), ("bilstm", {}), ("bilstm_avg", {})],
)
def test_loop_script_and_native_give_the_same_vectors_and_gradients(tokenizer, encoder, kw):
    """native: torch's kernels (cuDNN on a GPU), the paper's cell (no forget gate) with the gate held open."""
    batch = tokenizer.batch(TEXTS)
    torch.manual_seed(0)
    ref = build_encoder(tokenizer.vocab.size, tiny_cfg(encoder, impl="loop", **kw)).double()
    expected = ref(batch)
    expected.sum().backward()
    for impl in ("script", "native"):
        other = build_encoder(tokenizer.vocab.size, tiny_cfg(encoder, impl=impl, **kw)).double()
        other.load_state_dict(ref.state_dict())
        got = other(batch)
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-9)
        got.sum().backward()
        for (name, a), b in zip(other.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, atol=1e-10, rtol=1e-9, msg=f"{impl} {name}")


def test_native_refuses_peepholes(tokenizer):
    with pytest.raises(ValueError, match="native"):
        build_encoder(tokenizer.vocab.size, tiny_cfg("lstm", impl="native", peepholes=True))


def test_auto_runs_the_loop_on_the_cpu(tokenizer):
    rnn = build_encoder(tokenizer.vocab.size, tiny_cfg("lstm")).forward_rnn
    assert rnn.impl == "auto" and rnn.loop_for(torch.zeros(1)) == "loop"
    with_peepholes = build_encoder(tokenizer.vocab.size, tiny_cfg("lstm", peepholes=True)).forward_rnn
    assert not with_peepholes.native_ok


def test_lstm_gradients_match_finite_differences(tokenizer):
    small = Tokenizer(Vocab(tokenizer.vocab.tokens[:24], "small"), max_words=40)  # fewer inputs to perturb
    torch.manual_seed(0)
    model = TwoTower(small.vocab.size, tiny_cfg("lstm", ncell=3, peepholes=True, forget_gate=True)).double()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    queries = small.batch(["cordless drill", "rug"])
    docs = small.batch(["steel drill kit", "white lamp", "small rug", "brass sink with set"])
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())

    def loss(*values):
        q, d, _ = torch.func.functional_call(model, dict(zip(names, values, strict=True)), (queries, docs))
        return click_loss(q, d, LossConfig(gamma=3.0))

    assert torch.autograd.gradcheck(loss, params, eps=1e-6, atol=1e-5)


def test_internals_are_per_word_and_end_at_the_embedding(tokenizer):
    torch.manual_seed(0)
    enc = build_encoder(tokenizer.vocab.size, tiny_cfg("bilstm"))
    batch = tokenizer.batch(TEXTS)
    vec, internals = enc(batch, internals=True)
    longest = int(batch.lengths.max())
    assert set(internals) == {"i", "c", "o", "y", "bw_i", "bw_c", "bw_o", "bw_y"}
    for j, n in enumerate(batch.lengths.tolist()):
        assert internals["y"].shape == (len(TEXTS), longest, 6)
        torch.testing.assert_close(internals["y"][j, n - 1], vec[j, :6])  # forward ends at the last word
        torch.testing.assert_close(internals["bw_y"][j, 0], vec[j, 6:])  # backward ends at the first
        assert internals["i"][j, n:].abs().sum() == 0  # nothing past the end


def test_loss_is_equation_5():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    d = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 3.0]]])
    cfg = LossConfig(gamma=10.0, in_batch_negatives=False)
    cos = torch.tensor([[1.0, 0.0], [1 / math.sqrt(2), 1.0]])
    expected = -torch.log_softmax(10 * cos, 1)[:, 0].mean()
    torch.testing.assert_close(click_loss(q, d, cfg), expected)
    # in-batch negatives (the default): the other row's clicked title is one more negative
    with_others = torch.cat([cos, torch.tensor([[1 / math.sqrt(2)], [0.0]])], 1)  # q0·d1[0], q1·d0[0]
    in_batch = -torch.log_softmax(10 * with_others, 1)[:, 0].mean()
    torch.testing.assert_close(click_loss(q, d, LossConfig(gamma=10.0)), in_batch)
    # weighted by clicks: a row clicked three times counts three times
    per_row = -torch.log_softmax(10 * cos, 1)[:, 0]
    rows, both = weighted_rows(clicks=[3, 1], impressions=[10, 2], debiased=[7.5, 1.0]), np.arange(2)
    weights = pair_weights(rows, both, "clicks")
    torch.testing.assert_close(click_loss(q, d, cfg, weights), (3 * per_row[0] + per_row[1]) / 4)
    torch.testing.assert_close(pair_weights(rows, both, "ctr"), torch.tensor([0.3, 0.5]))
    torch.testing.assert_close(pair_weights(rows, both, "log_clicks"), torch.log1p(torch.tensor([3.0, 1.0])))
    torch.testing.assert_close(pair_weights(rows, both, "none"), torch.ones(2))
    # inverse-propensity weights: the debiased click counts of the rows
    torch.testing.assert_close(pair_weights(rows, both, "ipw"), torch.tensor([7.5, 1.0]))
    torch.testing.assert_close(pair_weights(rows, both, "log_ipw"), torch.log1p(torch.tensor([7.5, 1.0])))
    torch.testing.assert_close(pair_weights(rows, np.array([1]), "clicks"), torch.tensor([1.0]))


def weighted_rows(clicks: list, impressions: list, debiased: list) -> Rows:
    """Tokenised rows that carry only their click counts (text ids all 0, no negatives, no lists)."""
    n, none = len(clicks), np.zeros(len(clicks), np.int64)
    return Rows(
        *(np.array([0, n]), np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros((n, 0), np.int32)),
        *(np.array(v, np.float32) for v in (clicks, impressions, debiased)),
        shown=Ragged.of(none, np.zeros(0, np.int32)),
        relevance=Ragged.of(none, np.zeros(0, np.float32)),
    )


def keys_of(rows: list) -> torch.Tensor:
    """`row_keys` of (query, clicked title, ...) rows, their texts numbered as the token cache does."""
    texts = sorted({t for r in rows for t in r[:2]})
    keys = np.array([text_key(t) for t in texts])
    ids = {t: i for i, t in enumerate(texts)}
    return row_keys(keys, np.array([ids[r[0]] for r in rows]), np.array([ids[r[1]] for r in rows]))


# rows 0, 1 share a query; rows 0, 2 share a clicked title; row 3 shares nothing
MASK_ROWS = [("drill", "cordless drill", []), ("drill", "drill bit", []), ("drill kit", "cordless drill", [])]
MASK_ROWS += [("rug", "area rug", [])]


def hand_click_loss(q: torch.Tensor, d: torch.Tensor, gamma: float, skip) -> torch.Tensor:
    """Eq. (5) row by row: the row's own titles, then every other row's clicked title but `skip(i, j)`."""
    losses = []
    for i in range(q.shape[0]):
        titles = [*d[i], *(d[j, 0] for j in range(q.shape[0]) if j != i and not skip(i, j))]
        cos = torch.stack([F.cosine_similarity(q[i], t, dim=0) for t in titles])
        losses.append(-torch.log_softmax(gamma * cos, 0)[0])
    return torch.stack(losses).mean()


def test_masked_in_batch_negatives_skip_rows_of_the_same_query_or_clicked_title():
    torch.manual_seed(0)
    q, d = torch.randn(4, 3), torch.randn(4, 2, 3)  # one sampled negative per row
    keys = keys_of(MASK_ROWS)
    shared = {(i, j) for i, a in enumerate(MASK_ROWS) for j, b in enumerate(MASK_ROWS) if a[0] == b[0] or a[1] == b[1]}
    assert shared - {(i, i) for i in range(4)} == {(0, 1), (1, 0), (0, 2), (2, 0)}
    masked = hand_click_loss(q, d, 10.0, lambda i, j: (i, j) in shared)
    plain = hand_click_loss(q, d, 10.0, lambda i, j: False)
    on = LossConfig(gamma=10.0, mask_in_batch=True)
    torch.testing.assert_close(click_loss(q, d, on, keys=keys), masked)
    torch.testing.assert_close(training_loss(q, d, on, None, keys), masked)
    # off (the default): every other clicked title, whatever the keys
    assert not LossConfig().mask_in_batch
    torch.testing.assert_close(click_loss(q, d, LossConfig(gamma=10.0)), plain)
    torch.testing.assert_close(training_loss(q, d, LossConfig(gamma=10.0), None, keys), plain)
    assert float(masked) != pytest.approx(float(plain))
    # without in-batch negatives there is nothing to mask
    only_own = LossConfig(gamma=10.0, in_batch_negatives=False)
    torch.testing.assert_close(
        click_loss(q, d, replace(only_own, mask_in_batch=True), keys=keys), click_loss(q, d, only_own)
    )
    with pytest.raises(ValueError, match="keys"):
        click_loss(q, d, on)


def _masked_loss_on_a_rank(rank: int, port: int, q, d, keys, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        half = slice(2 * rank, 2 * rank + 2)
        q, d = q[half].clone().requires_grad_(), d[half].clone().requires_grad_()
        loss = click_loss(q, d, LossConfig(gamma=10.0, mask_in_batch=True), across_ranks=True, keys=keys[half])
        loss.backward()
        out[rank] = (loss.detach(), q.grad, d.grad)
    finally:
        dist.destroy_process_group()


@pytest.mark.integration  # more than one process
def test_masked_in_batch_negatives_across_two_gloo_ranks_are_the_global_batchs():
    """Each rank holds 2 of MASK_ROWS: row 0 and its masked rows 1 (same rank) and 2 (the other)."""
    torch.manual_seed(0)
    q, d = torch.randn(4, 3), torch.randn(4, 2, 3)
    keys = keys_of(MASK_ROWS)
    out = mp.Manager().dict()
    mp.spawn(_masked_loss_on_a_rank, args=(free_port(), q, d, keys, out), nprocs=2)
    q1, d1 = q.clone().requires_grad_(), d.clone().requires_grad_()
    one = click_loss(q1, d1, LossConfig(gamma=10.0, mask_in_batch=True), keys=keys)
    one.backward()
    torch.testing.assert_close((out[0][0] + out[1][0]) / 2, one.detach())
    # the backward hands each rank the gradient of the sum of the ranks' mean losses: 2x the global mean's
    torch.testing.assert_close(torch.cat([out[0][1], out[1][1]]) / 2, q1.grad)
    torch.testing.assert_close(torch.cat([out[0][2], out[1][2]]) / 2, d1.grad)


def test_row_keys_are_the_same_in_every_process():
    """Ranks compare the keys they gather from each other: no per-process salt (Python's hash())."""
    rows = [("cordless drill", "drill 18v", []), ("cordless drill", "ladder", []), ("rug", "drill 18v", [])]
    keys = keys_of(rows)
    assert keys.dtype == torch.int64 and keys.shape == (3, 2)
    assert keys[0, 0] == keys[1, 0] and keys[0, 1] == keys[2, 1]  # the same query; the same clicked title
    assert keys[0, 0] != keys[2, 0] and keys[0, 1] != keys[1, 1]
    texts = [t for r in rows for t in r[:2]]
    code = "import json, sys; from core.array_cache import text_key; print([text_key(t) for t in json.load(sys.stdin)])"
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True, env=env, check=True
        )
        assert done.stdout.strip() == str(keys.reshape(-1).tolist())


def test_listwise_loss_is_the_cross_entropy_of_the_targets_over_the_shown_titles():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    d = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 3.0]]])
    # row 1 carries a list of 3 titles, targets 0.5 / 0.5 / 0
    listed = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    mask = torch.tensor([[True, True, True]])
    targets = torch.tensor([[0.5, 0.5, 0.0]])
    cos = torch.tensor([1.0, 0.0, 1 / math.sqrt(2)])
    expected = -(targets[0] * torch.log_softmax(10 * cos, 0)).sum()
    torch.testing.assert_close(listwise_loss(q[1:], listed, mask, targets, 10.0), expected)
    # padded slots neither score nor count: the same list in a wider mask
    wide = torch.tensor([[True, True, True, False]])
    torch.testing.assert_close(listwise_loss(q[1:], listed, wide, torch.tensor([[0.5, 0.5, 0.0, 0.0]]), 10.0), expected)
    # mixed: (1 - λ) eq. (5) + λ listwise, with λ = 0.25
    lists = ListTargets(rows=torch.tensor([1]), docs=None, mask=mask, targets=targets)
    cfg = LossConfig(gamma=10.0, in_batch_negatives=False, listwise=0.25)
    plain = click_loss(q, d, cfg)
    mixed = training_loss(q, d, cfg, None, torch.tensor([[0, 0], [1, 1]]), lists=lists, listed=listed)
    torch.testing.assert_close(mixed, 0.75 * plain + 0.25 * expected)


def test_warm_up_and_linear_decay_set_the_step_size_of_every_update():
    from modeling.config import OptimConfig, TrainJob, rows_are_exact
    from modeling.optim import step_size_factor

    cfg = OptimConfig(warmup=0.1, decay="linear")
    factors = [step_size_factor(s, 100, cfg) for s in range(1, 101)]
    assert factors[:10] == pytest.approx([s / 10 for s in range(1, 11)])  # the first 10% rise to 1
    assert factors[10] == 1.0 and factors[-1] == pytest.approx(1 / 90)  # then down to 1/90 at the last
    assert factors[10:] == sorted(factors[10:], reverse=True)
    assert {step_size_factor(s, 100, OptimConfig()) for s in range(1, 101)} == {1.0}  # the paper's fixed step
    model = torch.nn.Linear(2, 2)
    train = TrainJob(optim=OptimConfig(name="adamw", adamw_lr=1e-3, warmup=0.5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    set_schedule(optimizer, 1, 4, train)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)
    assert not rows_are_exact(TrainJob(optim=OptimConfig(warmup=0.1)))  # rows assume a constant step


def test_momentum_schedule_is_the_papers():
    cfg = OptimConfig()
    mus = [momentum_at(s, 1000, cfg) for s in range(1, 1001)]
    assert mus[:20] == [0.9] * 20 and mus[-20:] == [0.9] * 20
    assert set(mus[20:-20]) == {0.995}


def test_row_wise_table_updates_are_torchs_dense_nesterov_sgd():
    """Rows a step does not read still drift with their momentum in the dense algorithm: the lazy
    closed form must land on the same weights and buffers, across the schedule's changes of μ."""
    cfg = OptimConfig(lr=0.02, momentum_edge=0.1, momentum=0.99, momentum_edge_value=0.5)
    total, generator = 60, torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    dense_table, row_table = HashingTable(40, 3).double(), HashingTable(40, 3).double()  # float64: exact, not rounding
    row_table.load_state_dict(dense_table.state_dict())
    dense = torch.optim.SGD(dense_table.parameters(), lr=cfg.lr, momentum=0.5, nesterov=True)
    sparse = torch.optim.SGD(row_table.parameters(), lr=cfg.lr, momentum=0.5, nesterov=True)
    runs = momentum_runs(momentum_at(s, total, cfg) for s in range(1, total + 1))
    assert [mu for *_, mu in runs] == [0.5, 0.99, 0.5]
    rows = TableRows([row_table], sparse, runs, step=0, across_ranks=False)
    target = torch.randn(2, 3, generator=generator, dtype=torch.float64)
    for step in range(1, total + 1):
        ids = torch.randint(0, 40 if step < 10 else 8, (6,), generator=generator)  # rows 8-39 idle after step 9
        offsets = torch.tensor([0, 3])
        for table, optimizer in ((dense_table, dense), (row_table, sparse)):
            set_schedule(optimizer, step, total, TrainJob(optim=cfg))
            optimizer.zero_grad()
            (table(ids, offsets) - target).pow(2).sum().backward()
        rows.gradients()
        rows.update()
        dense.step()
        sparse.step()  # the other parameters' optimiser: nothing of the table's
        if step in (25, total):
            rows.catch_up()
            torch.testing.assert_close(row_table.weight, dense_table.weight, atol=1e-12, rtol=1e-10)
            buffers = (
                sparse.state[row_table.weight]["momentum_buffer"],
                dense.state[dense_table.weight]["momentum_buffer"],
            )
            torch.testing.assert_close(*buffers, atol=1e-12, rtol=1e-10)
    rows.release()
    assert row_table.weight.requires_grad and row_table.rows is None


def test_config_overrides_and_errors(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("epochs: 3\nmodel:\n  encoder: rnn\n  hidden: [64, 32]\n")
    cfg = load_config(path, ["optim.lr=0.5", "model.peepholes=true", "data.batch_size=1_024"])
    assert (cfg.epochs, cfg.model.encoder, cfg.model.hidden) == (3, "rnn", [64, 32])
    assert (cfg.optim.lr, cfg.model.peepholes, cfg.data.batch_size) == (0.5, True, 1024)
    assert cfg.flat()["model.encoder"] == "rnn"
    with pytest.raises(DssmError, match="unknown key model.cells"):
        load_config(None, ["model.cells=3"])
    with pytest.raises(DssmError, match="choose one of"):
        load_config(None, ["model.encoder=transformer"])
    with pytest.raises(DssmError, match="cannot read"):
        load_config(None, ["epochs=many"])
    with pytest.raises(DssmError, match="key=value"):
        load_config(None, ["epochs"])


def gran_reference(enc, batch) -> torch.Tensor:
    """Wieting & Gimpel's GRAN and its variants for one text, step by step, from the encoder's own
    LSTM outputs h_t and word vectors x_t."""
    from modeling.encoders import hashed_words

    _, found = enc(batch, internals=True)
    h = found["y"][0].double()
    x = hashed_words(enc.rnn.bag, batch)[:, -enc.dim :].double()  # one text: words in order

    def gate(wx, wh, t, extra=0.0):
        bias = wx.bias.double() if wx.bias is not None else 0.0
        return torch.sigmoid(wx.weight.double() @ x[t] + bias + wh.weight.double() @ h[t] + extra)

    a = torch.zeros(enc.dim, dtype=torch.float64)
    steps = []
    for t in range(len(x)):
        g = gate(enc.w_x, enc.w_h, t, enc.w_a.weight.double()[: enc.dim] @ a if enc.kind == 4 else 0.0)
        if enc.kind == 1:
            a = x[t] * g
        elif enc.kind == 2:
            a = h[t] * g
        elif enc.kind == 5:
            a = x[t] * g + h[t] * gate(enc.w_x2, enc.w_h2, t)
        else:
            extra = enc.w_a.weight.double()[enc.dim :] @ a if enc.kind == 4 else 0.0
            a = a * g + x[t] * gate(enc.w_x2, enc.w_h2, t, extra)
        steps.append(a)
    return torch.stack(steps).mean(0) if enc.kind in (1, 2) else steps[-1]


@pytest.mark.parametrize("kind", [1, 2, 3, 4, 5])
def test_gran_variants_follow_their_equations(tokenizer, kind):
    torch.manual_seed(0)
    enc = build_encoder(tokenizer.vocab.size, tiny_cfg("gran", gran_type=kind))
    together = enc(tokenizer.batch(TEXTS))
    for j, text in enumerate(TEXTS):
        expected = gran_reference(enc, tokenizer.batch([text]))
        torch.testing.assert_close(together[j].double(), expected, atol=1e-5, rtol=1e-4)


def test_clsm_is_shen_et_als_convolution_written_out(tokenizer):
    torch.manual_seed(0)
    enc = build_encoder(tokenizer.vocab.size, tiny_cfg("clsm", window=3))
    torch.nn.init.normal_(enc.bias)
    out = enc(tokenizer.batch(TEXTS))
    for j, text in enumerate(TEXTS):
        words = [enc.bag(torch.tensor(ids), torch.tensor([0]))[0].view(3, 7) for ids in tokenizer.trigrams(text)]
        padded = [torch.zeros(3, 7), *words, torch.zeros(3, 7)]  # window 3: one zero word each side
        conv = torch.stack([torch.tanh(enc.bias + sum(padded[p + k][k] for k in range(3))) for p in range(len(words))])
        expected = torch.tanh(enc.semantic(conv.max(0).values))
        torch.testing.assert_close(out[j], expected, atol=1e-6, rtol=1e-5)


def test_bigran_adds_a_gran_that_reads_the_text_backwards(tokenizer):
    torch.manual_seed(0)
    enc = build_encoder(tokenizer.vocab.size, tiny_cfg("bigran"))
    backward_alone = build_encoder(tokenizer.vocab.size, tiny_cfg("gran"))
    backward_alone.load_state_dict(enc.backward_gran.state_dict())
    text = "outdoor led lamp for home"
    vec, found = enc(tokenizer.batch([text]), internals=True)
    reversed_text = backward_alone(tokenizer.batch([" ".join(reversed(text.split()))]))
    enc.backward_gran = None  # the forward GRAN alone
    torch.testing.assert_close(vec, enc(tokenizer.batch([text])) + reversed_text, atol=1e-6, rtol=1e-5)
    assert found["bw_y"].shape == found["y"].shape == (1, 5, 6)


@pytest.mark.parametrize("encoder", ["lstm", "gran", "avg"])
def test_dropout_acts_in_training_only(tokenizer, encoder):
    torch.manual_seed(0)
    enc = build_encoder(tokenizer.vocab.size, tiny_cfg(encoder, dropout=0.5))
    plain = build_encoder(tokenizer.vocab.size, tiny_cfg(encoder))
    plain.load_state_dict(enc.state_dict())
    batch = tokenizer.batch(TEXTS)
    enc.eval()
    torch.testing.assert_close(enc(batch), plain(batch))
    enc.train()
    torch.manual_seed(1)
    first = enc(batch)
    torch.manual_seed(1)
    assert not torch.allclose(first, plain(batch)) and torch.equal(first, enc(batch))
