"""embedding_cache_svc"""
