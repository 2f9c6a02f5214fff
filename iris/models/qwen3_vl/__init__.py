"""Qwen3-VL and Qwen3-VL-MoE: the Qwen2-VL image layout and counting with a new tower
(patch 16, learned position grid, 2D rope) whose entries carry deepstack levels."""
