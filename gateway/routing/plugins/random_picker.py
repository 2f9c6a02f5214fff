"""Picker `random`: a candidate drawn in proportion to its score (uniform if all are 0)."""

from __future__ import annotations

import random

from gateway.routing.plugins.base import Picker, register


@register
class RandomPicker(Picker):
    type = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def pick(self, pods, scores):
        if sum(scores) <= 0:
            return self._random.choice(list(pods))
        return self._random.choices(list(pods), weights=list(scores), k=1)[0]
