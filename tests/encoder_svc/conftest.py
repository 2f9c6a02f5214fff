"""Encoder test fixtures: the tiny checkpoints' runners (loaded once per session) and a
factory for a real encoder + cache service pair on loopback (stopped after each test)."""

from __future__ import annotations

import pytest

from tests.encoder_svc.stack import Family, Stack, load_family, start_stack


@pytest.fixture(scope="session")
def qwen(tiny_qwen2_vl_dir) -> Family:
    return load_family("qwen2_vl", tiny_qwen2_vl_dir)


@pytest.fixture(scope="session")
def idefics(tiny_idefics3_dir) -> Family:
    return load_family("idefics3", tiny_idefics3_dir)


@pytest.fixture
async def stack_factory():
    """`await stack_factory(family, **encoder_settings)` -> a started Stack."""
    stacks: list[Stack] = []

    async def start(family: Family, **settings) -> Stack:
        stack = await start_stack(family, **settings)
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        await stack.close()
