"""Qwen3.5's language model (`Qwen3_5ForCausalLM`): a plain, hybrid LM the engine runs
(llm_svc/engine/models/qwen3_5.py); `tiny.py` builds a random one for tests and local runs."""
