"""Fixtures for the engine tests: tiny checkpoints of both families (plain LM and VLM
layouts), HF transformers' greedy output as the reference, and engine builders."""

from __future__ import annotations

import pytest
import torch

from llm_svc.engine import EngineConfig, LLMEngine, SamplingParams
from tests.llm_svc.checkpoints import tiny_checkpoint

# The VLM layouts come from the suite's shared tiny checkpoints (tests/fixtures/models.py);
# the plain LMs are built here (tests/llm_svc/checkpoints.py).
_SHARED_FIXTURES = {
    "idefics3": "tiny_idefics3_dir",
    "qwen2_vl": "tiny_qwen2_vl_dir",
    "internvl": "tiny_internvl_dir",
    "mistral3": "tiny_mistral3_dir",
    "qwen3_5_vl_moe": "tiny_qwen3_5_vl_moe_dir",
}
KINDS = ["llama", "qwen2", "idefics3", "qwen2_vl"]


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread, as pods and TP ranks run: the tiny models gain nothing from
    more, and on a shared, loaded machine a second thread spins waiting for a core (the TP
    family tests' TP 1 steps ran ~15x slower with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _checkpoint(request, kind: str):
    name = _SHARED_FIXTURES.get(kind)
    return request.getfixturevalue(name) if name else tiny_checkpoint(kind)


@pytest.fixture(scope="session", params=KINDS)
def model_dir(request):
    """Each tiny checkpoint in turn: Llama and Qwen2 LMs, Idefics3 and Qwen2-VL layouts."""
    return _checkpoint(request, request.param)


@pytest.fixture(scope="session")
def llama_dir():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="session")
def demo_dir(demo_model_dir):
    """The demo model (real SmolLM2-135M LM in Idefics3 layout)."""
    return demo_model_dir


class HFReference:
    """HF transformers' greedy continuation, one loaded model per directory, memoised."""

    def __init__(self) -> None:
        self._models: dict = {}
        self._outputs: dict = {}

    def _model(self, model_dir):
        import transformers as tf

        if model_dir not in self._models:
            config = tf.AutoConfig.from_pretrained(model_dir)
            auto = tf.AutoModelForCausalLM
            if getattr(config, "vision_config", None) is not None:
                auto = tf.AutoModelForImageTextToText
            self._models[model_dir] = auto.from_pretrained(model_dir, dtype=torch.float32).eval()
        return self._models[model_dir]

    def greedy(self, model_dir, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        key = (str(model_dir), tuple(prompt_ids), max_new_tokens)
        if key not in self._outputs:
            ids = torch.tensor([prompt_ids])
            with torch.inference_mode():
                out = self._model(model_dir).generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    min_new_tokens=max_new_tokens,
                    do_sample=False,
                )
            self._outputs[key] = out[0, len(prompt_ids) :].tolist()
        return self._outputs[key]


@pytest.fixture(scope="session")
def hf_reference():
    return HFReference()


def make_engine(model_dir, **overrides) -> LLMEngine:
    args = dict(page_size=4, max_num_batched_tokens=64, num_pages=256, max_num_seqs=8)
    args.update(overrides)
    return LLMEngine(EngineConfig(model_dir, **args))


def greedy(max_tokens: int, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **extra)


def run_all(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]):
    """Add every request, step until done; returns {request_id: [outputs...]}."""
    for request_id, (ids, params) in requests.items():
        engine.add_request(request_id, ids, params)
    outputs: dict[str, list] = {request_id: [] for request_id in requests}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def token_ids(outputs) -> list[int]:
    return [token for out in outputs for token in out.new_token_ids]


@pytest.fixture(scope="session", params=["qwen2_vl", "idefics3", "internvl", "mistral3"])
def mm_reference(request):
    """Each tiny VLM family with its HF multimodal reference (tests/llm_svc/mm_reference.py)."""
    from tests.llm_svc.mm_reference import FAMILIES, MMReference

    return MMReference(request.getfixturevalue(FAMILIES[request.param]))


@pytest.fixture(scope="session")
def gemma3_reference(tiny_gemma3_dir):
    """The tiny Gemma 3 VLM with its HF multimodal reference."""
    from tests.llm_svc.mm_reference import MMReference

    return MMReference(tiny_gemma3_dir)


@pytest.fixture(scope="session")
def gemma4_reference(tiny_gemma4_dir):
    """The tiny Gemma 4 VLM with its HF multimodal reference."""
    from tests.llm_svc.mm_reference import MMReference

    return MMReference(tiny_gemma4_dir)


@pytest.fixture(scope="session")
def gemma4_e_reference(tiny_gemma4_e_dir):
    """The tiny E-style Gemma 4 VLM with its HF multimodal reference."""
    from tests.llm_svc.mm_reference import MMReference

    return MMReference(tiny_gemma4_e_dir)


@pytest.fixture(scope="session")
def qwen_reference(tiny_qwen2_vl_dir):
    from tests.llm_svc.mm_reference import MMReference

    return MMReference(tiny_qwen2_vl_dir)


@pytest.fixture(scope="module")
def memory_cache_service():
    """A real embedding cache service (memory store, 64 MiB) on loopback, per module."""
    from tests.embedding_cache_svc.helpers import ServerThread, make_settings

    service = ServerThread(make_settings("memory", memory_bytes=64 << 20))
    yield service
    service.close()
