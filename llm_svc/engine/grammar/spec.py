"""What a request asks its output to match: a kind and the text that defines it."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass


class ConstraintKind(enum.StrEnum):
    JSON_SCHEMA = "json_schema"  # value: a JSON Schema document
    JSON_OBJECT = "json_object"  # any JSON object; value unused
    REGEX = "regex"
    EBNF = "ebnf"  # an xgrammar EBNF grammar, root rule `root`
    STRUCTURAL_TAG = "structural_tag"  # an xgrammar structural tag (JSON)


@dataclass(frozen=True)
class Constraint:
    """A constraint on a request's output. Equal constraints share one compiled grammar."""

    kind: ConstraintKind
    value: str = ""

    @property
    def key(self) -> str:
        """The compile cache's key: a hash of kind and text."""
        digest = hashlib.sha256(f"{self.kind.value}\0{self.value}".encode())
        return digest.hexdigest()

    def describe(self) -> str:
        """A short name for error messages (never the whole text)."""
        return f"{self.kind.value} of {len(self.value.encode())} bytes"
