"""Image embeddings for the engine: where they come from (`EmbeddingSource`: the cache
service, or an in-process vision tower for offline use), how they are fetched off the
engine loop (`EmbeddingFetcher`), and how a chunk's input embeddings are assembled."""

from llm_svc.engine.embeddings.assembly import (
    ChunkImageRows,
    assemble_input_embeds,
    chunk_image_rows,
)
from llm_svc.engine.embeddings.base import EmbeddingSource
from llm_svc.engine.embeddings.cache_source import CacheEmbeddingSource
from llm_svc.engine.embeddings.fetcher import EmbeddingFetcher, FetchResult
from llm_svc.engine.embeddings.images import image_prompt, load_image
from llm_svc.engine.embeddings.vision_source import VisionEmbeddingSource

__all__ = [
    "CacheEmbeddingSource",
    "ChunkImageRows",
    "EmbeddingFetcher",
    "EmbeddingSource",
    "FetchResult",
    "VisionEmbeddingSource",
    "assemble_input_embeds",
    "chunk_image_rows",
    "image_prompt",
    "load_image",
]
