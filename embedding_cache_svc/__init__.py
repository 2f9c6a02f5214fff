"""The embedding cache service: per-image embeddings shared across the cluster (docs/design.md §1).

The server lives in `embedding_cache_svc.server`; callers import the client library from
`embedding_cache_svc.client`.
"""
