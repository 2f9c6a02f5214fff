from iris.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodeItem(_message.Message):
    __slots__ = ("image", "item")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    image: bytes
    item: _common_pb2.MultimodalItem
    def __init__(self, image: _Optional[bytes] = ..., item: _Optional[_Union[_common_pb2.MultimodalItem, _Mapping]] = ...) -> None: ...

class EncodeRequest(_message.Message):
    __slots__ = ("items", "fingerprint", "identity_salt")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_SALT_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[EncodeItem]
    fingerprint: bytes
    identity_salt: bytes
    def __init__(self, items: _Optional[_Iterable[_Union[EncodeItem, _Mapping]]] = ..., fingerprint: _Optional[bytes] = ..., identity_salt: _Optional[bytes] = ...) -> None: ...

class EncodeResult(_message.Message):
    __slots__ = ("key", "ok", "error", "retryable")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    ok: bool
    error: str
    retryable: bool
    def __init__(self, key: _Optional[bytes] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EncodeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[EncodeResult, _Mapping]]] = ...) -> None: ...
