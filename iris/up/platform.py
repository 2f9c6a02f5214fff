"""Start and stop the whole platform as separate processes on loopback ports.

The cache service, N encoders, N LLM pods and N gateways are each `python -m iris.cli
<service>` with their settings in the environment (the agreed IRIS_<SERVICE>_* names), so
what runs here is exactly what runs in a pod. Used by `iris up`, the end-to-end tests and
the workload benchmark.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from iris.up.metrics_page import metrics_url
from iris.up.processes import ChildProcess, free_port, wait_until

log = logging.getLogger(__name__)
HOST = "127.0.0.1"
# One client for every health check: `httpx.get` builds a TLS context per call (about
# 30 ms of CPU), which polling five times a second during a start would spend for nothing.
_HEALTH_CLIENT = httpx.Client()
# `iris up --router` names → the gateway's built-in router configs.
# "prefix" is the gateway's default; the two scorers by name compare them.
ROUTER_POLICIES = {
    "prefix": "prefix-aware",
    "estimated-wait": "estimated-wait",
    "estimated-ttft": "estimated-ttft",
    "round-robin": "round-robin",
}
KV_STORES = ("off", "memory", "redis", "redis-cluster")
DEFAULT_HOST_KV_BYTES = 256 << 20  # each pod's host tier when a store is on and none given
# A redis-server that holds only a cache: bounded, least recently used out, nothing on disk.
CACHE_ONLY_ARGS = ("--maxmemory-policy", "allkeys-lru", "--save", "", "--appendonly", "no")


@dataclass
class UpConfig:
    model_dir: Path
    llm_pods: int = 1
    tensor_parallel_size: int = 1  # ranks per LLM pod (IRIS_LLM_TENSOR_PARALLEL_SIZE)
    encoders: int = 1
    # Gateways, each its own process and port ("gateway", then "gateway-1", ...), all over
    # the same pods: each keeps its own routing state (docs/design/gateway.md).
    gateways: int = 1
    cache: str = "memory"  # memory | redis | redis-cluster (3 local masters)
    # The KV store the LLM pods share (IRIS_LLM_KV_STORE): off | memory (in each pod's
    # process: NOT shared between pods) | redis (a second redis-server) | redis-cluster (a
    # second cluster of 3 masters), never the embedding cache's own store.
    kv_store: str = "off"
    # Each LLM pod's host KV tier (IRIS_LLM_HOST_KV_BYTES), which a store needs; None: 256
    # MiB with a store, off without one.
    host_kv_bytes: int | None = None
    kv_store_maxmemory_mb: int = 512  # the store's maxmemory (allkeys-lru), per node
    router: str = "prefix"  # a key of ROUTER_POLICIES
    embedding_reuse: bool = True
    # Keys the gateway requires (Authorization: Bearer); none: open, as fits loopback.
    api_keys: tuple[str, ...] = ()
    log_dir: Path | None = None
    otlp_endpoint: str | None = None
    torch_threads: int = 1  # per LLM pod / encoder: several pods share the machine's cores
    # Extra environment by service kind ("encoder") or name ("encoder-1"; the name wins).
    extra_env: dict[str, dict[str, str]] = field(default_factory=dict)
    startup_timeout_s: float = 180.0
    # Which to start: the whole platform, or a leading part of it (benchmarks and tests
    # of one service): ("cache",) or ("cache", "encoder").
    services: tuple[str, ...] = ("cache", "encoder", "llm", "gateway")

    def __post_init__(self) -> None:
        if self.cache not in ("memory", "redis", "redis-cluster"):
            raise ValueError(f"cache must be memory, redis or redis-cluster, got {self.cache!r}")
        if self.kv_store not in KV_STORES:
            raise ValueError(
                f"kv_store must be off, memory, redis or redis-cluster, got {self.kv_store!r}"
            )
        if self.host_kv_bytes is None:
            self.host_kv_bytes = DEFAULT_HOST_KV_BYTES if self.kv_store != "off" else 0
        if self.host_kv_bytes < 0:
            raise ValueError(f"host_kv_bytes must be >= 0, got {self.host_kv_bytes}")
        if self.kv_store != "off" and self.host_kv_bytes == 0:
            raise ValueError(
                f"kv_store {self.kv_store} needs the host KV tier (host_kv_bytes > 0): the "
                f"store's pages are loaded into it"
            )
        if self.kv_store != "off" and self.tensor_parallel_size > 1:
            raise ValueError("kv_store needs tensor_parallel_size 1 (the engine refuses more)")
        if self.kv_store_maxmemory_mb < 1:
            raise ValueError(
                f"kv_store_maxmemory_mb must be >= 1, got {self.kv_store_maxmemory_mb}"
            )
        if self.router not in ROUTER_POLICIES:
            known = ", ".join(ROUTER_POLICIES)
            raise ValueError(f"router must be one of {known}, got {self.router!r}")
        parts = [("cache",), ("cache", "encoder"), ("cache", "encoder", "llm", "gateway")]
        if tuple(self.services) not in parts:
            raise ValueError(f"services must be one of {parts}, got {self.services!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.gateways < 1:
            raise ValueError(f"need at least one gateway, got {self.gateways}")
        if self.llm_pods < 1 or self.encoders < 1:
            raise ValueError(
                f"need at least one LLM pod and one encoder, got {self.llm_pods} and "
                f"{self.encoders}"
            )


def _settings_env(kind: str, settings: dict[str, str]) -> dict[str, str]:
    """A service's Settings fields as its environment: `cache_address` of the llm kind is
    IRIS_LLM_CACHE_ADDRESS."""
    return {f"IRIS_{kind.upper()}_{field.upper()}": value for field, value in settings.items()}


class StartupError(RuntimeError):
    """A service exited or never became healthy while the platform started (the message
    names it and where its log is)."""


class StartInterrupted(Exception):
    """The start was interrupted (its `interrupted` event was set: Ctrl-C or SIGTERM)."""


@dataclass
class Service:
    """A started (or startable) service: its process and where it listens."""

    name: str
    kind: str  # cache | encoder | llm | gateway | redis (the cache's or the KV store's)
    child: ChildProcess
    address: str  # host:port of its main endpoint
    health_url: str | None  # None: redis, which answers PING on `address` instead
    metrics_port: int | None = None  # where it serves /metrics (None: redis)

    def exited(self) -> bool:
        """Started, and no longer running."""
        return self.child.process is not None and not self.child.running()

    def describe_exit(self) -> str:
        return (
            f"{self.name} exited with code {self.child.process.returncode}; "
            f"its log: {self.child.log_path}"
        )


class Platform:
    """The running platform. Use as a context manager, or call start() / stop()."""

    def __init__(self, config: UpConfig) -> None:
        self.config = config
        self.log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="iris-up-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.services: list[Service] = []
        self.redis_url: str | None = None
        self.kv_store_url: str | None = None  # --kv-store redis: its redis:// URL
        self.kv_store_nodes: str | None = None  # --kv-store redis-cluster: its seeds
        self._data_dirs: list[Path] = []  # the Redis servers' folders, removed at stop
        self._interrupted: threading.Event | None = None  # see start()

    # --- building ------------------------------------------------------------------------

    def _python_service(
        self, name: str, kind: str, env: dict[str, str], port: int, health_url: str | None
    ) -> Service:
        common = {
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(self.config.torch_threads),
            "MKL_NUM_THREADS": str(self.config.torch_threads),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            # See iris/service_main.py: a library's fork must not break the gRPC poller.
            "GRPC_ENABLE_FORK_SUPPORT": "false",
        }
        if self.config.otlp_endpoint:
            common["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.config.otlp_endpoint
        child = ChildProcess(
            name=name,
            argv=[sys.executable, "-m", "iris.cli", kind],
            env={
                **common,
                **env,
                **self.config.extra_env.get(kind, {}),
                **self.config.extra_env.get(name, {}),
            },
            log_path=self.log_dir / f"{name}.log",
        )
        return Service(name, kind, child, f"{HOST}:{port}", health_url)

    def _grpc_service(self, name: str, kind: str, **settings: str) -> Service:
        """A gRPC service on two free ports (gRPC, metrics) with these Settings fields."""
        port, metrics_port = free_port(), free_port()
        env = _settings_env(
            kind, {"host": HOST, "port": str(port), "metrics_port": str(metrics_port), **settings}
        )
        service = self._python_service(
            name, kind, env, port, f"http://{HOST}:{metrics_port}/healthz"
        )
        service.metrics_port = metrics_port
        return service

    def _start_redis(
        self, name: str = "redis", extra_args: tuple[str, ...] = (), flag: str = "--cache redis"
    ) -> str:
        """A redis-server child on a free loopback port, started; returns its URL."""
        server = shutil.which("redis-server")
        if server is None:
            raise StartupError(f"{flag} needs redis-server on PATH (scripts/setup.sh)")
        port = free_port()
        folder = Path(tempfile.mkdtemp(prefix=f"iris-{name}-"))
        self._data_dirs.append(folder)
        argv = [server, "--bind", HOST, "--port", str(port), "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(folder), *extra_args]
        child = ChildProcess(name=name, argv=argv, log_path=self.log_dir / f"{name}.log")
        child.start()
        self.services.append(Service(name, "redis", child, f"{HOST}:{port}", None))
        return f"redis://{HOST}:{port}/0"

    def _start_redis_cluster(
        self,
        masters: int = 3,
        name: str = "redis",
        extra_args: tuple[str, ...] = (),
        flag: str = "--cache redis-cluster",
    ) -> str:
        """Three cluster masters as children, joined; returns the seed list."""
        from iris.up.redis_cluster import ClusterStartError, cluster_nodes, join

        folder = Path(tempfile.mkdtemp(prefix=f"iris-{name}-cluster-"))
        self._data_dirs.append(folder)
        try:
            nodes = cluster_nodes(folder, self.log_dir, masters, name, extra_args, flag)
            for index, (address, child) in enumerate(nodes):
                child.start()
                self.services.append(Service(f"{name}-{index}", "redis", child, address, None))
            join([address for address, _ in nodes], replicas=0, flag=flag)
        except ClusterStartError as err:
            raise StartupError(str(err)) from None
        return ",".join(address for address, _ in nodes)

    def _kv_store_settings(self) -> dict[str, str]:
        """The LLM pods' IRIS_LLM_KV_STORE* and host tier settings; starts the store's
        own redis-server (or cluster) when it is one, beside the embedding cache's: KV
        pages must never evict embeddings (docs/design/running.md, "KV store")."""
        kind = self.config.kv_store
        settings = {"host_kv_bytes": str(self.config.host_kv_bytes)}
        if kind == "off":
            return settings if self.config.host_kv_bytes else {}
        settings["kv_store"] = kind
        bounded = ("--maxmemory", f"{self.config.kv_store_maxmemory_mb}mb", *CACHE_ONLY_ARGS)
        if kind == "memory":
            # A name within each pod's own process: pods share nothing through it.
            settings["kv_store_url"] = "iris-up"
        elif kind == "redis":
            self.kv_store_url = self._start_redis("kv-store", bounded, "--kv-store redis")
            settings["kv_store_url"] = self.kv_store_url
        else:
            self.kv_store_nodes = self._start_redis_cluster(
                3, "kv-store", bounded, "--kv-store redis-cluster"
            )
            settings["kv_store_cluster_nodes"] = self.kv_store_nodes
        return settings

    def plan(self) -> None:
        """Pick ports and build every service's command and environment."""
        model = str(self.config.model_dir)
        cache_settings = {"store": self.config.cache}
        if self.config.cache == "redis":
            self.redis_url = self._start_redis()
            cache_settings["redis_url"] = self.redis_url
        elif self.config.cache == "redis-cluster":
            cache_settings["redis_cluster_nodes"] = self._start_redis_cluster()
        cache = self._grpc_service("cache", "cache", **cache_settings)
        self.services.append(cache)
        if self.config.services == ("cache",):
            return
        # A plain language model takes no images: no encoder is started (the gateway's
        # encoder list is empty and an image part is refused with a 400).
        for index in range(self.config.encoders if _takes_images(self.config.model_dir) else 0):
            encoder = self._grpc_service(
                f"encoder-{index}", "encoder", model=model, cache_address=cache.address
            )
            self.services.append(encoder)
        if "llm" not in self.config.services:
            return
        kv_settings = self._kv_store_settings()
        for index in range(self.config.llm_pods):
            name = f"llm-{index}"
            pod = self._grpc_service(
                name,
                "llm",
                model=model,
                cache_address=cache.address,
                pod_name=name,
                tensor_parallel_size=str(self.config.tensor_parallel_size),
                **kv_settings,
            )
            self.services.append(pod)
        for index in range(self.config.gateways):
            self.services.append(self._gateway(model, cache.address, index))

    def _gateway(self, model: str, cache_address: str, index: int) -> Service:
        """Gateway `index` on its own two free ports ("gateway" for the first)."""
        gateway_port, gateway_metrics_port = free_port(), free_port()
        gateway_settings = {
            "host": HOST,
            "port": str(gateway_port),
            "metrics_port": str(gateway_metrics_port),
            "model": model,
            "cache_address": cache_address,
            "encoder_addresses": ",".join(self.addresses("encoder")),
            "llm_addresses": ",".join(self.addresses("llm")),
            "router_config": ROUTER_POLICIES[self.config.router],
            "embedding_reuse": "true" if self.config.embedding_reuse else "false",
        }
        if self.config.api_keys:
            gateway_settings["api_keys"] = json.dumps(list(self.config.api_keys))
        gateway = self._python_service(
            "gateway" if index == 0 else f"gateway-{index}",
            "gateway",
            _settings_env("gateway", gateway_settings),
            gateway_port,
            f"http://{HOST}:{gateway_port}/readyz",
        )
        gateway.metrics_port = gateway_metrics_port
        return gateway

    # --- running -------------------------------------------------------------------------

    def addresses(self, kind: str) -> list[str]:
        return [service.address for service in self.services if service.kind == kind]

    def service(self, name: str) -> Service:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    @property
    def gateway_url(self) -> str:
        """The first gateway's URL."""
        return f"http://{self.service('gateway').address}"

    @property
    def gateway_urls(self) -> list[str]:
        """Every gateway's URL, the first one first."""
        return [f"http://{address}" for address in self.addresses("gateway")]

    def metrics_url(self, name: str) -> str:
        """Where the service `name` serves /metrics (its own port, for every service)."""
        return metrics_url(self.service(name))

    def start(self, interrupted: threading.Event | None = None) -> None:
        """Start every service and wait until each reports healthy (or fail with its log).

        `interrupted` (set by a signal handler) stops the start where it is with
        StartInterrupted: a flag polled between steps, never an exception thrown into
        whatever the main thread happens to be doing."""
        self._interrupted = interrupted
        if not self.services:
            self.plan()
        # The gateway asks the pods for their model info at start: start it last.
        for service in self.services:
            if service.kind not in ("redis", "gateway"):
                self._check_interrupted()
                service.child.start()
        for service in self.services:
            if service.kind != "gateway":
                self.wait_healthy(service)
        gateways = [service for service in self.services if service.kind == "gateway"]
        for gateway in gateways:  # together: each waits only on the pods, not on the others
            self._check_interrupted()
            gateway.child.start()
        for gateway in gateways:
            self.wait_healthy(gateway)

    def _check_interrupted(self) -> None:
        if self._interrupted is not None and self._interrupted.is_set():
            raise StartInterrupted()

    def exited(self) -> list[Service]:
        """The services that were started and have exited since."""
        return [service for service in self.services if service.exited()]

    def wait_healthy(self, service: Service, only_itself: bool = False) -> None:
        """Wait until `service` is healthy; StartupError if it, or (unless `only_itself`)
        any other started service, exits first (the gateway waits on the pods: a pod that
        died is the cause to name, not the gateway), or after the startup timeout."""

        def healthy() -> bool:
            self._check_interrupted()
            watched = [service] if only_itself else self.services
            for gone in (other for other in watched if other.exited()):
                raise StartupError(f"{gone.describe_exit()}\n{gone.child.tail(12)}")
            return self.is_healthy(service)

        if not wait_until(healthy, self.config.startup_timeout_s, 0.2):
            raise StartupError(
                f"{service.name} not healthy after {self.config.startup_timeout_s:.0f}s; "
                f"its log: {service.child.log_path}\n{service.child.tail(12)}"
            )

    @staticmethod
    def is_healthy(service: Service, timeout_s: float = 1.0) -> bool:
        """Whether `service` answers its health check right now."""
        if service.health_url is None:
            return _redis_answers(service.address, timeout_s)
        try:
            return _HEALTH_CLIENT.get(service.health_url, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Stop every service, gateway first, and remove the Redis data folders."""
        for service in reversed(self.services):
            service.child.stop()
        for folder in self._data_dirs:
            shutil.rmtree(folder, ignore_errors=True)

    def restart(self, name: str) -> None:
        """Start a stopped service again on the same ports (fault tests)."""
        service = self.service(name)
        service.child.start()
        self.wait_healthy(service, only_itself=True)

    def __enter__(self) -> Platform:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _redis_answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether a Redis server on `address` answers PING."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as connection:
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _takes_images(model_dir: Path) -> bool:
    """Whether the checkpoint at `model_dir` is a vision-language model (has an adapter).
    A directory without a config plans as one: the encoder then names what is missing."""
    from iris.models import has_adapter
    from iris.models.checkpoint import read_config

    try:
        architectures = read_config(Path(model_dir)).get("architectures") or [""]
    except FileNotFoundError:
        return True
    return has_adapter(architectures[0])
