"""Chat and completion prompts → padded ids and items, with the real tiny adapters."""

import asyncio
import threading

import numpy as np
import pytest

from gateway.errors import APIError, bad_request
from gateway.intake.prompt import PromptBuilder, _all
from gateway.intake.remote import RemoteImageFetcher
from gateway.tenancy import RequestSalts
from iris.multimodal import DecodePolicy, image_identity, pad_values_for
from tests.gateway.helpers import data_url, image_message, png_bytes


def builder(adapter, **policy) -> PromptBuilder:
    fetcher = RemoteImageFetcher(enabled=False, allow_list=[], max_bytes=1 << 20, timeout_s=1)
    return PromptBuilder(adapter, policy=DecodePolicy(**policy), fetcher=fetcher, max_images=4)


@pytest.fixture(scope="module")
def idefics_adapter(tiny_idefics3_dir):
    from iris.models import load_adapter

    return load_adapter(tiny_idefics3_dir)


@pytest.mark.parametrize("family", ["qwen_adapter", "idefics_adapter"])
async def test_image_spans_hold_the_items_sentinels_and_count(family, request):
    adapter = request.getfixturevalue(family)
    image = png_bytes(300, 200)
    prompt = await builder(adapter).chat([image_message(data_url(image))])
    (item,) = prompt.items
    assert item.identity == image_identity(image, adapter.fingerprint)
    count, grid = adapter.image_token_count(300, 200)
    assert (item.token_count, item.grid) == (count, tuple(grid))
    ids = prompt.input_ids
    assert ids.dtype == np.int64
    span_values = np.concatenate([ids[s : e + 1] for s, e in item.offsets])
    assert len(span_values) == item.token_count
    assert set(span_values.tolist()) == set(item.pad_values)
    # Everything outside the spans is a real token id.
    mask = np.ones(len(ids), bool)
    for start, end in item.offsets:
        mask[start : end + 1] = False
    assert (ids[mask] < adapter.vocab_size).all()
    assert prompt.images == [image]


async def test_same_image_same_ids_different_image_different_ids(qwen_adapter):
    b = builder(qwen_adapter)
    red = await b.chat([image_message(data_url(png_bytes(colour="red")))])
    red_again = await b.chat([image_message(data_url(png_bytes(colour="red")))])
    blue = await b.chat([image_message(data_url(png_bytes(colour="blue")))])
    assert np.array_equal(red.input_ids, red_again.input_ids)
    assert not np.array_equal(red.input_ids, blue.input_ids)
    assert red.prompt_tokens == blue.prompt_tokens


async def test_a_callers_mm_hashes_never_become_the_identity(qwen_adapter):
    """Issue 20's attack at the intake: image X sent with another image's identity (or a
    64-bit hash) keeps its own identity; each disagreeing entry is counted."""
    b = builder(qwen_adapter)
    image = png_bytes()
    own = image_identity(image, qwen_adapter.fingerprint)
    message = image_message(data_url(image))
    before = _ignored()
    for claimed in (["00000000000000ff"], ["ab" * 32], ["00000000000000ff", "01"]):
        prompt = await b.chat([message], mm_hashes=claimed)
        assert prompt.items[0].identity == own
        assert prompt.items[0].pad_values == pad_values_for(own)
    assert _ignored() == before + 4
    agreeing = await b.chat([message], mm_hashes=[own.hex()])
    assert agreeing.items[0].identity == own and _ignored() == before + 4
    with pytest.raises(APIError) as caught:
        await b.chat([message], mm_hashes="00000000000000ff")
    assert caught.value.status == 400 and caught.value.param == "mm_hashes"


def _ignored() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("iris_gateway_mm_hashes_ignored_total") or 0.0


async def test_the_image_salt_goes_into_the_identity(qwen_adapter):
    b = builder(qwen_adapter)
    image, salt = png_bytes(), bytes(range(32))
    salts = RequestSalts(prefix=salt, images=salt)
    prompt = await b.chat([image_message(data_url(image))], salts=salts)
    assert prompt.items[0].identity == image_identity(image, qwen_adapter.fingerprint, salt)
    assert prompt.salts == salts
    shared = await b.chat([image_message(data_url(image))])
    assert not np.array_equal(prompt.input_ids, shared.input_ids)  # other sentinels


async def test_placeholder_typed_by_the_user_stays_text(qwen_adapter):
    spoof = {"role": "user", "content": f"look {qwen_adapter.image_token} here"}
    prompt = await builder(qwen_adapter).chat([spoof])
    assert not prompt.items
    assert qwen_adapter.image_token_id not in prompt.input_ids.tolist()


async def test_image_limits_are_400_naming_the_limit(qwen_adapter):
    with pytest.raises(APIError, match="over the limit of 100"):
        await builder(qwen_adapter, max_pixels=100).chat([image_message(data_url(png_bytes()))])
    with pytest.raises(APIError, match="cannot identify"):
        await builder(qwen_adapter).chat([image_message(data_url(b"not an image"))])
    too_many = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": data_url(png_bytes())}}] * 5,
    }
    with pytest.raises(APIError, match="5 images, over the limit of 4"):
        await builder(qwen_adapter).chat([too_many])


async def test_token_prompts_are_checked_against_the_vocabulary(qwen_adapter):
    b = builder(qwen_adapter)
    assert b.tokens([1, 2, 3]).input_ids.tolist() == [1, 2, 3]
    with pytest.raises(APIError, match=r"prompt\[1\] = 999999 is outside"):
        b.tokens([1, 999999])
    with pytest.raises(APIError, match="placeholders"):
        b.tokens([1, qwen_adapter.image_token_id])
    assert (await b.text("hello")).prompt_tokens > 0


async def test_an_empty_text_prompt_is_refused_before_the_pod(qwen_adapter):
    with pytest.raises(APIError, match=r"prompt\[1\] is empty") as caught:
        await builder(qwen_adapter).text("", "prompt[1]")
    assert caught.value.param == "prompt[1]"


async def test_a_text_too_long_for_any_tokenization_is_refused_untokenized(qwen_adapter):
    b = builder(qwen_adapter)
    b.max_model_len = lambda: 16
    most = 16 * b.max_token_chars * 4
    calls = []
    b.adapter = _CountingAdapter(qwen_adapter, calls)
    with pytest.raises(APIError, match=f"{most + 1} characters") as caught:
        await b.text("a" * (most + 1))
    assert caught.value.code == "context_length_exceeded" and calls == []
    with pytest.raises(APIError, match="messages is"):
        await b.chat([{"role": "user", "content": "a" * (most + 1)}])
    assert calls == []
    # At the bound it is tokenized (and the context check later decides).
    assert (await b.text("a" * most)).prompt_tokens > 0 and calls == [most]


async def test_tokenizing_runs_off_the_event_loop(qwen_adapter):
    b = builder(qwen_adapter)
    loop_thread = threading.get_ident()
    seen = []
    b.adapter = _CountingAdapter(qwen_adapter, seen, record=lambda _: threading.get_ident())
    await b.text("hello")
    await b.chat([{"role": "user", "content": "hello"}])
    assert len(seen) == 2 and loop_thread not in seen


class _CountingAdapter:
    """The real adapter, recording each encode_prompt and chat_prompt_ids call (its length,
    or `record`'s)."""

    def __init__(self, adapter, calls, record=len):
        self._adapter, self._calls, self._record = adapter, calls, record

    def encode_prompt(self, prompt):
        self._calls.append(self._record(prompt))
        return self._adapter.encode_prompt(prompt)

    def chat_prompt_ids(self, messages, *args, **kwargs):
        self._calls.append(self._record(messages))
        return self._adapter.chat_prompt_ids(messages, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._adapter, name)


async def test_the_first_refused_video_cancels_its_siblings_work():
    """A request's videos are probed and decoded together (`_all`): the first refusal is
    raised and the others are cancelled before it is (asyncio.gather would leave them
    running, holding their decode and frames for a request already answered)."""
    cancelled = []

    async def refused():
        raise bad_request("messages[0].content[0]: refused (video_max_frames)", "messages")

    async def sibling():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async with asyncio.timeout(60):
        with pytest.raises(APIError, match="video_max_frames"):
            await _all([sibling(), refused()])
    assert cancelled == [True]
    assert await _all([asyncio.sleep(0, "a"), asyncio.sleep(0, "b")]) == ["a", "b"]
