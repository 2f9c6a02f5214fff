"""gRPC clients of the services the gateway calls: the cache, the encoders, the LLM pods."""
