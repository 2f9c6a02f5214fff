"""redis-py 8.1's asyncio connection, closed under a command by another task, raises
AttributeError instead of ConnectionError (seen in the cluster failover test); 8.2 raises
ConnectionError again. The store reads either as a lost connection, and no other
AttributeError."""

import pytest
import redis.asyncio

from embedding_cache_svc.store.redis_store import _NETWORK_ERRORS, _connection_dropped_mid_command


async def test_a_command_on_a_connection_closed_underneath_counts_as_dropped():
    connection = redis.asyncio.Connection(host="127.0.0.1", port=1)
    # Never connected, or disconnected by another task: the writer is gone.
    with pytest.raises((AttributeError, *_NETWORK_ERRORS)) as caught:
        await connection._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])
    if isinstance(caught.value, AttributeError):  # redis-py 8.1
        assert _connection_dropped_mid_command(caught.value)
    else:  # redis-py 8.2 and later: a ConnectionError, which the store already counts
        assert isinstance(caught.value, redis.exceptions.ConnectionError)


def test_any_other_attribute_error_is_a_bug_not_an_outage():
    with pytest.raises(AttributeError) as caught:
        None.writelines([])  # type: ignore[attr-defined]
    assert not _connection_dropped_mid_command(caught.value)
