"""The embedding cache service: per-item embeddings shared across the cluster
(docs/design/cache.md).

The server lives in `embedding_cache_svc.server`; callers import the client library from
`embedding_cache_svc.client`.
"""
