"""Wire ↔ domain: GenerateRequest fields into engine inputs, engine outputs into messages.

Proto3 cannot tell an unset number from zero, so zero means "the default" wherever zero is
not a legal value (top_p, repetition_penalty, max_tokens); temperature 0 is greedy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from iris.multimodal import (
    SALT_BYTES,
    Modality,
    MultimodalItem,
    check_spans,
    hash_of_identity,
)
from iris.proto import common_pb2
from llm_svc.engine import SamplingParams, TokenLogprobs
from llm_svc.engine.grammar import Constraint, ConstraintKind
from llm_svc.proto import llm_pb2
from llm_svc.server.errors import RequestError

IDENTITY_BYTES = 32
_CONSTRAINT_KINDS = {
    common_pb2.Constraint.JSON_SCHEMA: ConstraintKind.JSON_SCHEMA,
    common_pb2.Constraint.JSON_OBJECT: ConstraintKind.JSON_OBJECT,
    common_pb2.Constraint.REGEX: ConstraintKind.REGEX,
    common_pb2.Constraint.EBNF: ConstraintKind.EBNF,
    common_pb2.Constraint.STRUCTURAL_TAG: ConstraintKind.STRUCTURAL_TAG,
}
# The pod embeds images only: a VIDEO or AUDIO item would be scattered as if it were an
# image, so the wire's other modalities are refused by name.
# A VIDEO item is one frame group, read from the cache like an image.
_MODALITIES = {common_pb2.IMAGE: Modality.IMAGE, common_pb2.VIDEO: Modality.VIDEO}


def sampling_params(
    proto: common_pb2.SamplingParams, prompt_len: int, max_model_len: int
) -> SamplingParams:
    """The engine's SamplingParams; the engine validates ranges when the request is added."""
    max_tokens = proto.max_tokens or max(1, max_model_len - prompt_len)
    params = SamplingParams(
        temperature=float(proto.temperature),
        top_p=float(proto.top_p) if proto.top_p else 1.0,
        top_k=int(proto.top_k),
        min_p=float(proto.min_p),
        repetition_penalty=float(proto.repetition_penalty) if proto.repetition_penalty else 1.0,
        frequency_penalty=float(proto.frequency_penalty),
        presence_penalty=float(proto.presence_penalty),
        max_tokens=int(max_tokens),
        min_tokens=int(proto.min_tokens),
        reasoning=proto.reasoning,
        stop=list(proto.stop),
        stop_token_ids=[int(token) for token in proto.stop_token_ids],
        ignore_eos=proto.ignore_eos,
        include_stop_str_in_output=proto.include_stop_str_in_output,
        skip_special_tokens=(
            proto.skip_special_tokens if proto.HasField("skip_special_tokens") else True
        ),
        logprobs=int(proto.top_logprobs) if proto.logprobs else None,
        logit_bias={int(token): float(value) for token, value in proto.logit_bias.items()},
        constraint=constraint(proto.constraint) if proto.HasField("constraint") else None,
    )
    if proto.HasField("seed"):
        # The wire seed is 64-bit unsigned; the engine's generator takes [0, 2^63).
        params.seed = int(proto.seed) % 2**63
    return params


def cache_salt(salt: bytes) -> bytes:
    """The request's prefix-cache salt: empty (shared) or 32 bytes, else RequestError."""
    if len(salt) not in (0, SALT_BYTES):
        raise RequestError(f"cache_salt has {len(salt)} bytes: must be 0 or {SALT_BYTES}")
    return bytes(salt)


def constraint(proto: common_pb2.Constraint) -> Constraint:
    """The engine's Constraint; its size, depth and compilability are the engine's checks."""
    kind = _CONSTRAINT_KINDS.get(proto.kind)
    if kind is None:
        names = ", ".join(common_pb2.Constraint.Kind.Name(k) for k in _CONSTRAINT_KINDS)
        raise RequestError(
            f"sampling.constraint.kind={proto.kind} is invalid: must be one of {names}"
        )
    return Constraint(kind, proto.value)


def multimodal_items(protos: Sequence[common_pb2.MultimodalItem], length: int) -> list:
    """Items as iris.multimodal.MultimodalItem, checked against the prompt length.

    Raises RequestError naming the item and the rule it breaks.
    """
    items = [_item(index, proto) for index, proto in enumerate(protos)]
    try:
        check_spans(items, length)
    except ValueError as err:
        raise RequestError(f"items: {err}") from None
    return items


def _known(value: int) -> bool:
    return value in common_pb2.Modality.values()


def _item(index: int, proto: common_pb2.MultimodalItem) -> MultimodalItem:
    where = f"items[{index}]"
    modality = _MODALITIES.get(proto.modality)
    if modality is None:
        name = common_pb2.Modality.Name(proto.modality) if _known(proto.modality) else None
        raise RequestError(
            f"{where}.modality={name or proto.modality} is not supported: this pod serves "
            "IMAGE and VIDEO items only"
        )
    item = MultimodalItem(modality=modality)
    if proto.identity:
        if len(proto.identity) != IDENTITY_BYTES:
            raise RequestError(
                f"{where}.identity has {len(proto.identity)} bytes: must be {IDENTITY_BYTES}"
            )
        item.set_identity(proto.identity)
        if proto.hash and proto.hash != hash_of_identity(proto.identity):
            raise RequestError(
                f"{where}.hash={proto.hash:#018x} is invalid: must be the identity's first "
                f"8 bytes {item.hash:#018x}"
            )
    elif proto.hash:
        item.set_hash(proto.hash)
    else:
        raise RequestError(f"{where} has neither identity nor hash")
    item.offsets = [(span.start, span.end) for span in proto.offsets]
    if not item.offsets:
        raise RequestError(f"{where}.offsets is empty: an item needs at least one span")
    item.grid = tuple(proto.grid)
    item.token_count = proto.token_count
    spans = sum(end - start + 1 for start, end in item.offsets if end >= start)
    if item.token_count != spans:
        raise RequestError(
            f"{where}.token_count={item.token_count} is invalid: must equal the span "
            f"lengths' sum {spans}"
        )
    return item


def token_chunk(
    token_ids: Sequence[int],
    text: str,
    logprobs: Sequence[TokenLogprobs],
    token_text: Callable[[int], str],
) -> llm_pb2.GenerateResponse:
    chunk = llm_pb2.TokenChunk(token_ids=list(token_ids), text=text)
    for entry in logprobs:
        chunk.logprobs.append(
            llm_pb2.TokenLogprob(
                token_id=entry.token_id,
                token=token_text(entry.token_id),
                logprob=entry.logprob,
                top=[
                    llm_pb2.TopLogprob(token_id=token, token=token_text(token), logprob=value)
                    for token, value in entry.top
                ],
            )
        )
    return llm_pb2.GenerateResponse(tokens=chunk)


def accepted(prompt_tokens: int, cached_tokens: int, image_tokens: int) -> llm_pb2.GenerateResponse:
    return llm_pb2.GenerateResponse(
        accepted=llm_pb2.Accepted(
            prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, image_tokens=image_tokens
        )
    )


def finished(reason: str, usage: llm_pb2.Usage) -> llm_pb2.GenerateResponse:
    return llm_pb2.GenerateResponse(finished=llm_pb2.Finished(finish_reason=reason, usage=usage))
