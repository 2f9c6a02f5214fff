"""Shared protobuf messages. Generated modules are committed; `generate()` rebuilds them."""
