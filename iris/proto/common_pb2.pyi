from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Modality(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODALITY_UNSPECIFIED: _ClassVar[Modality]
    IMAGE: _ClassVar[Modality]
    VIDEO: _ClassVar[Modality]
    AUDIO: _ClassVar[Modality]
MODALITY_UNSPECIFIED: Modality
IMAGE: Modality
VIDEO: Modality
AUDIO: Modality

class Span(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class MultimodalItem(_message.Message):
    __slots__ = ("modality", "identity", "hash", "offsets", "token_count", "grid")
    MODALITY_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    GRID_FIELD_NUMBER: _ClassVar[int]
    modality: Modality
    identity: bytes
    hash: int
    offsets: _containers.RepeatedCompositeFieldContainer[Span]
    token_count: int
    grid: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, modality: _Optional[_Union[Modality, str]] = ..., identity: _Optional[bytes] = ..., hash: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., token_count: _Optional[int] = ..., grid: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("dtype", "shape", "checksum")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    checksum: int
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., checksum: _Optional[int] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "repetition_penalty", "frequency_penalty", "presence_penalty", "seed", "stop_token_ids", "stop", "max_tokens", "ignore_eos", "logprobs", "top_logprobs", "logit_bias", "constraint", "min_p", "include_stop_str_in_output", "skip_special_tokens", "min_tokens", "reasoning")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stop: _containers.RepeatedScalarFieldContainer[str]
    max_tokens: int
    ignore_eos: bool
    logprobs: bool
    top_logprobs: int
    logit_bias: _containers.ScalarMap[int, float]
    constraint: Constraint
    min_p: float
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    min_tokens: int
    reasoning: bool
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., stop: _Optional[_Iterable[str]] = ..., max_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., min_p: _Optional[float] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., reasoning: _Optional[bool] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("kind", "value")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Constraint.Kind]
        JSON_SCHEMA: _ClassVar[Constraint.Kind]
        JSON_OBJECT: _ClassVar[Constraint.Kind]
        REGEX: _ClassVar[Constraint.Kind]
        EBNF: _ClassVar[Constraint.Kind]
        STRUCTURAL_TAG: _ClassVar[Constraint.Kind]
    KIND_UNSPECIFIED: Constraint.Kind
    JSON_SCHEMA: Constraint.Kind
    JSON_OBJECT: Constraint.Kind
    REGEX: Constraint.Kind
    EBNF: Constraint.Kind
    STRUCTURAL_TAG: Constraint.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    kind: Constraint.Kind
    value: str
    def __init__(self, kind: _Optional[_Union[Constraint.Kind, str]] = ..., value: _Optional[str] = ...) -> None: ...

class TraceContext(_message.Message):
    __slots__ = ("traceparent", "tracestate")
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    traceparent: str
    tracestate: str
    def __init__(self, traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...
