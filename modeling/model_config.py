"""The `model` section of a training config (modeling/config.py): which encoder and its shape. A module of
its own because the encoders read it (modeling/encoders.py, modeling/transformer.py) while the training
config checks it against their catalogue: neither has to import the other's module for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from core.config import Between


@dataclass
class ModelConfig:
    encoder: str = "lstm"  # the encoder: a name of modeling.encoders.ENCODERS (docs/training.md#encoders-modelencoder)
    tokens: Literal["trigrams", "words"] = "trigrams"  # trigrams: the paper's word hashing; words: a vector per word
    ncell: Annotated[int, Between(1, 8_192)] = 96  # hidden size of the recurrent encoders (the paper: 96)
    forget_gate: bool = False  # LSTM forget gate (the paper's experiments have none, section IV)
    peepholes: bool = False  # LSTM peephole connections (the paper's experiments have none)
    hidden: list[int] = field(default_factory=lambda: [300, 300])  # dssm: tanh layers (Huang et al.); clsm: [conv]
    out_dim: Annotated[int, Between(1, 8_192)] = 128  # dssm/clsm: the semantic layer's size (Huang et al. 2013: 128)
    window: Literal[1, 3, 5] = 3  # clsm word window (1, 3 or 5)
    # true: one tower for queries and titles (better on Home Depot's dev split: docs/studies/tied-towers.md);
    # false: the paper's separate query and document towers (Λ_Q, Λ_D of Algorithm 1)
    shared_towers: bool = True
    # longer texts are truncated (truncated BPTT length T of Algorithm 1)
    max_words: Annotated[int, Between(1, 10_000)] = 40
    dropout: float = 0.0  # Wieting & Gimpel: dropout on word input vectors in training (recurrent, avg)
    gran_type: Literal[1, 2, 3, 4, 5] = 1  # gran/bigran: 1 = eq. (1); 2-5: the authors' variants (modeling/encoders.py)
    impl: Literal["auto", "loop", "script", "native"] = "auto"  # recurrent loop; native: nn.LSTM/nn.RNN where it can
    # minilm (modeling/transformer.py): start from the bundled all-MiniLM-L6-v2; false: a small random BERT (tests)
    pretrained: bool = True
    # minilm: top layers trained; the embeddings and layers below are frozen and cached
    train_layers: Annotated[int, Between(0, 64)] = 2
    # minilm: word pieces read per text
    max_tokens: Annotated[int, Between(3, 512)] = 32
    # minilm with pretrained=false: layers of the random BERT (hidden size: ncell)
    transformer_layers: Annotated[int, Between(1, 64)] = 2
