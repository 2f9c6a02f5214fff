"""EndpointSlice objects → ready host:port addresses."""

from gateway.routing.discovery import ready_addresses


def test_ready_endpoints_on_the_named_port():
    slices = [
        {
            "ports": [{"name": "metrics", "port": 9103}, {"name": "grpc", "port": 50053}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": True, "terminating": True}},
                {"addresses": ["fd00::4"], "conditions": {}},
            ],
        },
        {"ports": [{"port": 50053}], "endpoints": [{"addresses": ["10.0.0.5"]}]},
        {"ports": [], "endpoints": [{"addresses": ["10.0.0.6"]}]},
    ]
    assert ready_addresses(slices, "grpc") == [
        "10.0.0.1:50053",
        "10.0.0.5:50053",
        "[fd00::4]:50053",
    ]
