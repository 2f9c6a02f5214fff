"""Generated protobuf / gRPC modules of the embedding cache (`python -m iris.proto.generate`)."""
