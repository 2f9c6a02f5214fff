"""setup_tracing's OTLP exporter reaches a real OTLP/gRPC receiver on loopback."""

import subprocess
import sys
import textwrap

from iris.up.processes import wait_until


def test_spans_exported_over_otlp_from_two_processes(otlp_collector):
    # Two processes (two "services"); the second continues the first's trace from headers.
    first = textwrap.dedent(
        f"""
        from iris import telemetry
        telemetry.setup_tracing("svc-a", endpoint={otlp_collector.endpoint!r})
        with telemetry.tracer("a").start_as_current_span("outer"):
            print(telemetry.inject_headers()["traceparent"])
        telemetry.shutdown_tracing()
        """
    )
    traceparent = subprocess.run(
        [sys.executable, "-c", first], capture_output=True, text=True, check=True
    ).stdout.strip()
    second = textwrap.dedent(
        f"""
        from iris import telemetry
        telemetry.setup_tracing("svc-b", endpoint={otlp_collector.endpoint!r})
        ctx = telemetry.extract_headers({{"traceparent": {traceparent!r}}})
        with telemetry.tracer("b").start_as_current_span("inner", context=ctx):
            pass
        telemetry.shutdown_tracing()
        """
    )
    subprocess.run([sys.executable, "-c", second], check=True)
    assert wait_until(lambda: len(otlp_collector.spans()) >= 2, 10)
    spans = {span.name: span for span in otlp_collector.spans()}
    assert spans["outer"].service == "svc-a" and spans["inner"].service == "svc-b"
    assert spans["inner"].trace_id == spans["outer"].trace_id == traceparent.split("-")[1]
    assert spans["inner"].parent_span_id == spans["outer"].span_id
