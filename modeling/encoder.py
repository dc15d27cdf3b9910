"""The base every text encoder derives from (modeling/encoders.py's, modeling/transformer.py's MiniLM), in a
module of its own so that neither of those imports the other to name it."""

from __future__ import annotations

from torch import nn

from modeling.tables import HashingTable


class Encoder(nn.Module):
    """What every encoder is: `dim` (the size of its text vectors), `forward(batch, internals=False)`
    (vectors, or (vectors, per-step internals) when asked), and its token embedding tables."""

    dim: int

    def token_tables(self) -> list[HashingTable]:
        """The tables indexed by token id: warm-started row by row, pulled toward step 0 by λ_w,
        updated row-wise in training (modeling/tables.py)."""
        return [m for m in self.modules() if isinstance(m, HashingTable)]
