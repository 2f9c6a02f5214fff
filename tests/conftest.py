"""Suite-wide pytest setup. Shared fixtures live in tests/fixtures/, one module per concern."""

import os

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite forks service processes while its own gRPC servers and channels are running;
# gRPC's fork handlers must stay out of that (see iris/service_main.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.redis_server",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.otlp_collector",
    "tests.fixtures.platform",
    "tests.fixtures.certs",
    "tests.fixtures.thinking",
]
