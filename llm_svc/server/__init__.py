"""The LLM pod's gRPC server (docs/design/engine.md): the engine on its own thread, streaming
Generate, Abort, model info, KV events with snapshots, load, health and /metrics.

`LLMServer(settings).start()` in a running event loop, or `serve(settings)` to run one until
cancelled. Folder map: worker.py (engine thread) → streams.py (events onto the loop) →
service.py (gRPC servicer; convert.py wire ↔ domain, errors.py status codes); kv_events.py
(numbered events + snapshot); metrics.py + http.py (/metrics, /healthz); server.py assembles.
"""

from llm_svc.server.server import LLMServer, model_info, serve

__all__ = ["LLMServer", "model_info", "serve"]
