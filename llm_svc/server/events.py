"""What crosses between the gRPC side and the engine thread.

A `Submission` goes in; `Admitted`, `Produced` and `Rejected` come out, in order per
request: Rejected alone, or Admitted, then Produced until one is finished (or a Rejected
if the engine fails mid-way, or the request's own data fails a check in a later step).
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any

from llm_svc.engine import RequestOutput, SamplingParams


@dataclass
class Submission:
    """One request handed to the engine thread; `arrival` starts its TTFT clock."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    items: list[Any] = field(default_factory=list)
    cache_salt: bytes = b""  # the tenant's prefix-cache namespace (b"": shared)
    arrival: float = field(default_factory=time.monotonic)
    # The request's context (its llm.Generate span current), for work done on its behalf
    # off the server's event loop (embedding fetches), so those spans join its trace.
    context: contextvars.Context | None = None

    @property
    def image_tokens(self) -> int:
        return sum(item.token_count for item in self.items)


@dataclass
class Admitted:
    """The scheduler took the request in: prefill starts (its embeddings are present)."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    image_tokens: int
    # Wall clock (ns) at the start of the step that first ran it: it goes out once that
    # step has ended, so the request's span marks when its prefill began with this.
    step_started_ns: int = 0


@dataclass
class Produced:
    """New tokens / text of an admitted request (the last one has finished=True)."""

    request_id: str
    output: RequestOutput


@dataclass
class Rejected:
    """The request ends with an error: before acceptance the engine refused it; after it,
    the step failed or the request's own data did (the stream ends with the error's status)."""

    request_id: str
    error: BaseException


StreamEvent = Admitted | Produced | Rejected
