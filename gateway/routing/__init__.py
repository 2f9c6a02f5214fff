"""Routing (docs/design/gateway.md): the pods, the KV index fed by their events, and the plugin
chain filter → weighted scorers → picker that chooses one pod per request."""
