"""Tokens sampled on the device that the host has not read yet (overlap scheduling).

When a step is launched, each sampling sequence gets a PLACEHOLDER id at the end of its
token ids; the step's `PendingTokens` maps the sequence to its row of the step's sampled
ids, still on the device. The next step may be prepared before the host reads them: its
input ids and penalty histories take those rows by device indexing (no host sync), and
the placeholder is overwritten once the step is retired."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llm_svc.engine.sequence import PLACEHOLDER, Sequence
from llm_svc.engine.transfer import to_device

__all__ = ["PLACEHOLDER", "PendingTokens"]


@dataclass
class PendingTokens:
    """`token_ids` [rows] on the device; `rows[seq]` is the row sampled for `seq`."""

    token_ids: torch.Tensor
    rows: dict[Sequence, int]

    def gather(self, seqs: list[Sequence]) -> torch.Tensor:
        """The pending token of each of `seqs` (each must be in `rows`), on the device."""
        index = np.fromiter((self.rows[seq] for seq in seqs), dtype=np.int64, count=len(seqs))
        return self.token_ids.index_select(0, to_device(index, self.token_ids.device))
