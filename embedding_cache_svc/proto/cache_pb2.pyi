from iris.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    PRESENT: _ClassVar[Status]
    PENDING: _ClassVar[Status]
    RESERVED: _ClassVar[Status]
    FAILED: _ClassVar[Status]
    FREE: _ClassVar[Status]
    MISS: _ClassVar[Status]
STATUS_UNSPECIFIED: Status
PRESENT: Status
PENDING: Status
RESERVED: Status
FAILED: Status
FREE: Status
MISS: Status

class EntryHeader(_message.Message):
    __slots__ = ("token_count", "hidden", "tensor", "fingerprint")
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    token_count: int
    hidden: int
    tensor: _common_pb2.TensorHeader
    fingerprint: bytes
    def __init__(self, token_count: _Optional[int] = ..., hidden: _Optional[int] = ..., tensor: _Optional[_Union[_common_pb2.TensorHeader, _Mapping]] = ..., fingerprint: _Optional[bytes] = ...) -> None: ...

class PutChunk(_message.Message):
    __slots__ = ("fingerprint", "key", "header", "data")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    key: bytes
    header: EntryHeader
    data: bytes
    def __init__(self, fingerprint: _Optional[bytes] = ..., key: _Optional[bytes] = ..., header: _Optional[_Union[EntryHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutReply(_message.Message):
    __slots__ = ("bytes_stored",)
    BYTES_STORED_FIELD_NUMBER: _ClassVar[int]
    bytes_stored: int
    def __init__(self, bytes_stored: _Optional[int] = ...) -> None: ...

class ItemRequest(_message.Message):
    __slots__ = ("key", "token_count")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    token_count: int
    def __init__(self, key: _Optional[bytes] = ..., token_count: _Optional[int] = ...) -> None: ...

class BatchGetRequest(_message.Message):
    __slots__ = ("fingerprint", "items", "hidden", "dtype")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    items: _containers.RepeatedCompositeFieldContainer[ItemRequest]
    hidden: int
    dtype: str
    def __init__(self, fingerprint: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[ItemRequest, _Mapping]]] = ..., hidden: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class GetChunk(_message.Message):
    __slots__ = ("index", "status", "header", "data", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    status: Status
    header: EntryHeader
    data: bytes
    reason: str
    def __init__(self, index: _Optional[int] = ..., status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[EntryHeader, _Mapping]] = ..., data: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...

class KeysRequest(_message.Message):
    __slots__ = ("fingerprint", "keys")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, fingerprint: _Optional[bytes] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ExistsReply(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, present: _Optional[_Iterable[bool]] = ...) -> None: ...

class DeleteReply(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("fingerprint", "items", "lease_ms", "take_over")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    TAKE_OVER_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    items: _containers.RepeatedCompositeFieldContainer[ItemRequest]
    lease_ms: int
    take_over: bool
    def __init__(self, fingerprint: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[ItemRequest, _Mapping]]] = ..., lease_ms: _Optional[int] = ..., take_over: _Optional[bool] = ...) -> None: ...

class ItemState(_message.Message):
    __slots__ = ("status", "reason")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    status: Status
    reason: str
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class StatesReply(_message.Message):
    __slots__ = ("states",)
    STATES_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[ItemState]
    def __init__(self, states: _Optional[_Iterable[_Union[ItemState, _Mapping]]] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("fingerprint", "key", "reason", "token_count")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    key: bytes
    reason: str
    token_count: int
    def __init__(self, fingerprint: _Optional[bytes] = ..., key: _Optional[bytes] = ..., reason: _Optional[str] = ..., token_count: _Optional[int] = ...) -> None: ...

class FailReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ("fingerprint", "items", "deadline_ms")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    items: _containers.RepeatedCompositeFieldContainer[ItemRequest]
    deadline_ms: int
    def __init__(self, fingerprint: _Optional[bytes] = ..., items: _Optional[_Iterable[_Union[ItemRequest, _Mapping]]] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class ReportCorruptRequest(_message.Message):
    __slots__ = ("fingerprint", "key", "reason")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    key: bytes
    reason: str
    def __init__(self, fingerprint: _Optional[bytes] = ..., key: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportCorruptReply(_message.Message):
    __slots__ = ("dropped", "finding")
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    FINDING_FIELD_NUMBER: _ClassVar[int]
    dropped: bool
    finding: str
    def __init__(self, dropped: _Optional[bool] = ..., finding: _Optional[str] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("store", "entries", "bytes", "capacity_bytes", "hits", "misses", "discards", "evictions", "reservations")
    STORE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    DISCARDS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    store: str
    entries: int
    bytes: int
    capacity_bytes: int
    hits: int
    misses: int
    discards: int
    evictions: int
    reservations: int
    def __init__(self, store: _Optional[str] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., discards: _Optional[int] = ..., evictions: _Optional[int] = ..., reservations: _Optional[int] = ...) -> None: ...
