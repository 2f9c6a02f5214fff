from iris.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "input_ids", "items", "sampling", "trace", "fingerprint", "cache_salt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    items: _containers.RepeatedCompositeFieldContainer[_common_pb2.MultimodalItem]
    sampling: _common_pb2.SamplingParams
    trace: _common_pb2.TraceContext
    fingerprint: bytes
    cache_salt: bytes
    def __init__(self, request_id: _Optional[str] = ..., input_ids: _Optional[_Iterable[int]] = ..., items: _Optional[_Iterable[_Union[_common_pb2.MultimodalItem, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., fingerprint: _Optional[bytes] = ..., cache_salt: _Optional[bytes] = ...) -> None: ...

class Accepted(_message.Message):
    __slots__ = ("prompt_tokens", "cached_tokens", "image_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_tokens: int
    image_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., image_tokens: _Optional[int] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("token_ids", "text", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens", "image_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    image_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., image_tokens: _Optional[int] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("finish_reason", "usage")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    usage: Usage
    def __init__(self, finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("accepted", "tokens", "finished")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    accepted: Accepted
    tokens: TokenChunk
    finished: Finished
    def __init__(self, accepted: _Optional[_Union[Accepted, _Mapping]] = ..., tokens: _Optional[_Union[TokenChunk, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "fingerprint", "page_size", "vocab_size", "max_model_len", "chat_template", "pod_name", "layers")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    fingerprint: bytes
    page_size: int
    vocab_size: int
    max_model_len: int
    chat_template: str
    pod_name: str
    layers: _containers.RepeatedCompositeFieldContainer[AttentionLayer]
    def __init__(self, model_id: _Optional[str] = ..., fingerprint: _Optional[bytes] = ..., page_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., chat_template: _Optional[str] = ..., pod_name: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[AttentionLayer, _Mapping]]] = ...) -> None: ...

class AttentionLayer(_message.Message):
    __slots__ = ("kind", "window", "snapshot_interval")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FULL: _ClassVar[AttentionLayer.Kind]
        SLIDING: _ClassVar[AttentionLayer.Kind]
        LINEAR: _ClassVar[AttentionLayer.Kind]
    FULL: AttentionLayer.Kind
    SLIDING: AttentionLayer.Kind
    LINEAR: AttentionLayer.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    kind: AttentionLayer.Kind
    window: int
    snapshot_interval: int
    def __init__(self, kind: _Optional[_Union[AttentionLayer.Kind, str]] = ..., window: _Optional[int] = ..., snapshot_interval: _Optional[int] = ...) -> None: ...

class KVEvent(_message.Message):
    __slots__ = ("seq", "kind", "block_hashes", "parent_hash")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STORED: _ClassVar[KVEvent.Kind]
        REMOVED: _ClassVar[KVEvent.Kind]
        SNAPSHOT_STORED: _ClassVar[KVEvent.Kind]
        WINDOW_REMOVED: _ClassVar[KVEvent.Kind]
        HOST_STORED: _ClassVar[KVEvent.Kind]
        HOST_REMOVED: _ClassVar[KVEvent.Kind]
        STORE_STORED: _ClassVar[KVEvent.Kind]
    STORED: KVEvent.Kind
    REMOVED: KVEvent.Kind
    SNAPSHOT_STORED: KVEvent.Kind
    WINDOW_REMOVED: KVEvent.Kind
    HOST_STORED: KVEvent.Kind
    HOST_REMOVED: KVEvent.Kind
    STORE_STORED: KVEvent.Kind
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: KVEvent.Kind
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    parent_hash: bytes
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[_Union[KVEvent.Kind, str]] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., parent_hash: _Optional[bytes] = ...) -> None: ...

class KVEventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[KVEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[KVEvent, _Mapping]]] = ...) -> None: ...

class KVEventsRequest(_message.Message):
    __slots__ = ("since_seq",)
    SINCE_SEQ_FIELD_NUMBER: _ClassVar[int]
    since_seq: int
    def __init__(self, since_seq: _Optional[int] = ...) -> None: ...

class KVSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KVSnapshot(_message.Message):
    __slots__ = ("seq", "block_hashes", "snapshot_hashes", "windowless_hashes", "host_hashes")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_HASHES_FIELD_NUMBER: _ClassVar[int]
    WINDOWLESS_HASHES_FIELD_NUMBER: _ClassVar[int]
    HOST_HASHES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    snapshot_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    windowless_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    host_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, seq: _Optional[int] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., snapshot_hashes: _Optional[_Iterable[bytes]] = ..., windowless_hashes: _Optional[_Iterable[bytes]] = ..., host_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Load(_message.Message):
    __slots__ = ("kv_utilisation", "running", "waiting", "pending_prefill_tokens", "prefill_tokens_per_s", "host_load_bytes_per_s", "store_fetch_bytes_per_s", "kv_bytes_per_token", "kv_store")
    KV_UTILISATION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    PENDING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    HOST_LOAD_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    STORE_FETCH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_STORE_FIELD_NUMBER: _ClassVar[int]
    kv_utilisation: float
    running: int
    waiting: int
    pending_prefill_tokens: int
    prefill_tokens_per_s: float
    host_load_bytes_per_s: float
    store_fetch_bytes_per_s: float
    kv_bytes_per_token: int
    kv_store: bool
    def __init__(self, kv_utilisation: _Optional[float] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., pending_prefill_tokens: _Optional[int] = ..., prefill_tokens_per_s: _Optional[float] = ..., host_load_bytes_per_s: _Optional[float] = ..., store_fetch_bytes_per_s: _Optional[float] = ..., kv_bytes_per_token: _Optional[int] = ..., kv_store: _Optional[bool] = ...) -> None: ...

class ResetPrefixCacheRequest(_message.Message):
    __slots__ = ("silent",)
    SILENT_FIELD_NUMBER: _ClassVar[int]
    silent: bool
    def __init__(self, silent: _Optional[bool] = ...) -> None: ...

class ResetPrefixCacheResponse(_message.Message):
    __slots__ = ("pages_freed",)
    PAGES_FREED_FIELD_NUMBER: _ClassVar[int]
    pages_freed: int
    def __init__(self, pages_freed: _Optional[int] = ...) -> None: ...
