"""Qwen3.5 and Qwen3.5-MoE: the plain hybrid LMs the engine runs (llm_svc/engine/models/
qwen3_5.py), and the image-text models (`adapter.py`, `runner.py`: Qwen3-VL's rules and
tower without deepstack); `tiny.py` builds random ones for tests and local runs."""
