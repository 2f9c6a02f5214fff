"""kopf handlers: the pod index, and the reconcile timer of each IrisAutoscaler.

Each round: check the spec, read both Deployments' replicas (scale subresource), scrape the
ready pods each selector picks, ask the pure policy, write the changed replicas back through
the scale subresource and the outcome into status. Per-autoscaler state (the policy's
history, the last scale times) lives in kopf's per-object memo, so it is lost on restart —
the stabilisation windows then simply start empty.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import aiohttp
import kopf

from iris import metrics
from operators import instruments
from operators.kube import DeploymentMissing, make_apps_api, read_replicas, write_replicas
from operators.ownership import NotOwned, check_owned
from operators.pods import index_pod, select_pods
from operators.policy import History, Loads, PoolDecision, PoolLoads, desired_replicas
from operators.scrape import encoder_load, llm_load, scrape_pool
from operators.settings import OperatorSettings
from operators.spec import PoolSpec, parse_spec
from operators.status import Condition, merge_conditions, pool_status

GROUP, VERSION, PLURAL = "iris.dev", "v1alpha1", "irisautoscalers"
INDEX_ID = "pods_by_label"


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> kopf.Memo:
    """Attach every handler to `registry`; return the memo to pass to kopf.operator()."""
    kopf.on.startup(registry=registry)(configure)
    if settings.api_server:
        kopf.on.login(registry=registry)(_login_to(settings.api_server))
    else:
        kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.index("", "v1", "pods", registry=registry, id=INDEX_ID)(index_pod)
    kopf.timer(
        GROUP, VERSION, PLURAL, registry=registry, id="reconcile", interval=settings.interval_s
    )(reconcile)
    return kopf.Memo(settings=settings, apps_api=make_apps_api(settings.api_server))


def configure(*, settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings: no CRD discovery watch (so no cluster-wide RBAC), quiet events."""
    settings.scanning.disabled = True
    settings.posting.level = 30  # logging.WARNING: post Kubernetes events for problems only


def _login_to(server: str):
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server.rstrip("/"), insecure=True)

    return login


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def reconcile(
    *,
    spec: Any,
    status: Any,
    meta: Any,
    namespace: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: Any,
    **kwargs: Any,
) -> None:
    """One round for one autoscaler (the kopf timer)."""
    now_iso = _utc_now()
    try:
        parsed = parse_spec(spec)
    except kopf.PermanentError as err:
        _write_not_ready(patch, status, now_iso, "InvalidSpec", str(err))
        raise
    api = memo.apps_api
    try:
        deployments = [parsed.llm.deployment, parsed.encoder.deployment]
        await check_owned(api, namespace, deployments, memo.settings.owner_label)
    except NotOwned as err:
        _write_not_ready(patch, status, now_iso, "NotOwned", str(err))
        raise
    try:
        llm_current = await read_replicas(api, namespace, parsed.llm.deployment)
        encoder_current = await read_replicas(api, namespace, parsed.encoder.deployment)
    except kopf.TemporaryError as err:
        reason = "DeploymentNotFound" if isinstance(err, DeploymentMissing) else "ApiError"
        _write_not_ready(patch, status, now_iso, reason, str(err))
        raise

    index = kwargs[INDEX_ID]
    settings: OperatorSettings = memo.settings
    async with aiohttp.ClientSession() as session:
        llm_pool, llm_ready, llm_failures = await _pool_loads(
            session, index, namespace, parsed.llm, llm_current, llm_load, settings, logger
        )
        encoder_pool, encoder_ready, encoder_failures = await _pool_loads(
            session,
            index,
            namespace,
            parsed.encoder,
            encoder_current,
            encoder_load,
            settings,
            logger,
        )

    history: History = getattr(memo, "history", None) or History()
    decision = desired_replicas(
        Loads(llm=llm_pool, encoder=encoder_pool, now=time.monotonic()), parsed, history
    )
    scaled: dict[str, str] = dict(getattr(memo, "last_scale", None) or {})
    write_errors: dict[str, str] = {}
    # Each pool is written on its own: a failed write of one never skips the other, nor the
    # status below.
    for kind, pool_spec, pool_decision in (
        ("llm", parsed.llm, decision.llm),
        ("encoder", parsed.encoder, decision.encoder),
    ):
        try:
            if await _apply(api, namespace, kind, pool_spec, pool_decision, logger):
                scaled[kind] = now_iso
        except kopf.TemporaryError as err:
            write_errors[kind] = str(err)
            logger.warning(f"scale write for {kind} failed: {err}")
    memo.last_scale = scaled
    memo.history = committed_history(history, decision.history, failed=set(write_errors))

    patch.status["observedGeneration"] = meta.get("generation")
    patch.status["llm"] = pool_status(
        parsed.llm.deployment,
        decision.llm,
        llm_ready,
        len(llm_pool.pods),
        llm_pool.failed,
        scaled.get("llm"),
        llm_failures,
        write_errors.get("llm"),
    )
    patch.status["encoder"] = pool_status(
        parsed.encoder.deployment,
        decision.encoder,
        encoder_ready,
        len(encoder_pool.pods),
        encoder_pool.failed,
        scaled.get("encoder"),
        encoder_failures,
        write_errors.get("encoder"),
    )
    if scaled:
        patch.status["lastScaleTime"] = max(scaled.values())
    patch.status["conditions"] = merge_conditions(
        status.get("conditions"),
        _conditions(decision.llm, decision.encoder, write_errors),
        now_iso,
    )


def committed_history(old: History, new: History, failed: set[str]) -> History:
    """The history to keep after this round's writes: a pool's history moves on only when
    its write succeeded (or none was needed); a pool whose write failed keeps its old past,
    so the next round decides again from what was actually applied."""
    return History(
        llm=old.llm if "llm" in failed else new.llm,
        encoder=old.encoder if "encoder" in failed else new.encoder,
    )


async def _pool_loads(
    session: aiohttp.ClientSession,
    index: Any,
    namespace: str,
    pool_spec: PoolSpec,
    current: int,
    read: Any,
    settings: OperatorSettings,
    logger: Any,
) -> tuple[PoolLoads, int, dict[str, str]]:
    """Scrape the ready pods of one pool: its loads, its ready pods, and why each failed
    scrape failed (pod name -> reason)."""
    ready = [pod for pod in select_pods(index, namespace, pool_spec.match_labels) if pod.ready]
    loads, failures = await scrape_pool(
        session,
        {pod.name: pod.ip for pod in ready},
        pool_spec.metrics_port,
        settings.scrape_timeout_s,
        read,
        settings.scrape_max_bytes,
    )
    for name, why in failures.items():
        instruments.SCRAPE_FAILURES.labels(**{metrics.LABEL_POD: name}).inc()
        logger.warning(f"scrape of pod {name} failed: {why}")
    pool = PoolLoads(current=current, pods=tuple(loads), failed=len(failures))
    return pool, len(ready), failures


async def _apply(
    api: Any, namespace: str, kind: str, pool_spec: PoolSpec, decision: PoolDecision, logger: Any
) -> bool:
    """Write a changed replica count; True when the Deployment was scaled."""
    labels = {metrics.LABEL_DEPLOYMENT: pool_spec.deployment, metrics.LABEL_KIND: kind}
    instruments.CURRENT_REPLICAS.labels(**labels).set(decision.current)
    instruments.DESIRED_REPLICAS.labels(**labels).set(decision.desired)
    if decision.desired == decision.current:
        return False
    await write_replicas(api, namespace, pool_spec.deployment, decision.desired)
    instruments.SCALE_EVENTS.labels(
        **{metrics.LABEL_KIND: kind, metrics.LABEL_REASON: decision.reason}
    ).inc()
    logger.info(
        f"scaled {kind} {pool_spec.deployment}: {decision.current} -> {decision.desired} "
        f"({decision.message})"
    )
    return True


def _conditions(
    llm: PoolDecision, encoder: PoolDecision, write_errors: dict[str, str]
) -> list[Condition]:
    pools = {"llm": llm, "encoder": encoder}
    inactive = [f"{kind}: {d.message}" for kind, d in pools.items() if not d.active]
    limited = [f"{kind}: {d.limited}" for kind, d in pools.items() if d.limited]
    limit_reasons = sorted({d.limited for d in pools.values() if d.limited})
    return [
        Condition("Ready", True, "Reconciled", "both Deployments found and the spec is valid"),
        Condition(
            "ScalingActive",
            not inactive,
            "NoMetrics" if inactive else "MetricsRead",
            "; ".join(inactive) or "both pools' metrics were read",
        ),
        Condition(
            "ScalingLimited",
            bool(limited),
            "+".join(limit_reasons) if limited else "WithinBounds",
            "; ".join(limited) or "no bound cut into the decision",
        ),
        Condition(
            "ScaleWritten",
            not write_errors,
            "WriteFailed" if write_errors else "Written",
            "; ".join(f"{kind}: {why}" for kind, why in sorted(write_errors.items()))
            or "every changed replica count was written",
        ),
    ]


def _write_not_ready(patch: kopf.Patch, status: Any, now_iso: str, reason: str, why: str):
    conditions = [
        Condition("Ready", False, reason, why),
        Condition("ScalingActive", False, reason, "not reconciled: see Ready"),
    ]
    old = list(status.get("conditions") or [])
    merged = merge_conditions(old, conditions, now_iso)
    kept = [c for c in old if c.get("type") not in {"Ready", "ScalingActive"}]
    patch.status["conditions"] = merged + kept
