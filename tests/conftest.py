"""Suite-wide pytest setup. Shared fixtures live in tests/fixtures/, one module per concern."""

import os

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = [
    "tests.fixtures.models",
    "tests.fixtures.redis_server",
    "tests.fixtures.otlp_collector",
    "tests.fixtures.platform",
]
