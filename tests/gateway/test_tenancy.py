"""Salt derivation (gateway/tenancy.py): which requests share a salt, and which cannot."""

import pytest

from gateway.errors import APIError
from gateway.tenancy import (
    RequestSalts,
    Tenancy,
    bearer_key,
    check_cache_salt,
    request_salts,
    tenant_salt,
)


def test_shared_tenancy_salts_only_requests_with_a_cache_salt():
    assert tenant_salt(Tenancy.SHARED, None, "some-key") is None
    a = tenant_salt(Tenancy.SHARED, "team-a", "key-1")
    assert len(a) == 32
    assert a == tenant_salt(Tenancy.SHARED, "team-a", "key-2")  # the key plays no part
    assert a != tenant_salt(Tenancy.SHARED, "team-b", None)


def test_per_key_tenancy_gives_each_key_its_own_salt():
    one, two = (tenant_salt(Tenancy.PER_KEY, None, key) for key in ("key-1", "key-2"))
    assert one != two and one is not None
    # A client's cache_salt splits its key's space; it cannot reach another key's salt,
    # nor a salt of shared tenancy (another derivation context).
    split = tenant_salt(Tenancy.PER_KEY, "team-a", "key-1")
    assert split not in (one, two, tenant_salt(Tenancy.PER_KEY, "team-a", "key-2"))
    assert split != tenant_salt(Tenancy.SHARED, "team-a", None)
    assert one != tenant_salt(Tenancy.SHARED, "key-1", None)
    # No key (an open gateway): as shared.
    assert tenant_salt(Tenancy.PER_KEY, "team-a", None) == tenant_salt(
        Tenancy.SHARED, "team-a", None
    )


def test_the_no_reuse_mode_salts_images_afresh_per_request_but_not_prefixes():
    tenant = tenant_salt(Tenancy.SHARED, "team-a", None)
    assert request_salts(tenant, True) == RequestSalts(prefix=tenant, images=tenant)
    first, second = request_salts(None, False), request_salts(None, False)
    assert first.prefix is None and second.prefix is None
    assert len(first.images) == 32 and first.images != second.images


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer ", None),
        (None, None),
    ],
)
def test_bearer_key(header, key):
    assert bearer_key(header) == key


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "cache_salt must be a string, got int"),
        (["a"], "cache_salt must be a string, got list"),
        ("", "cache_salt must be a non-empty string"),
        ("x" * 11, "cache_salt is 11 characters, over the limit of 10"),
        ("\ud800", "cache_salt is not valid Unicode"),
    ],
)
def test_a_bad_cache_salt_is_a_400(value, message):
    with pytest.raises(APIError) as refused:
        check_cache_salt(value, 10)
    assert refused.value.status == 400 and refused.value.param == "cache_salt"
    assert message in refused.value.message


def test_a_good_cache_salt_passes():
    assert check_cache_salt("team-a", 10) == "team-a"
    assert check_cache_salt(None, 10) is None
