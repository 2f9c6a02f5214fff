"""What a request's videos will cost, from their headers, before any frame is decoded
(docs/design/multimodal.md, "Video", refused before decoding).

A header gives each video's frame size and declared duration; Iris's time grid turns them
into grid frames, frame groups, tokens (groups x the adapter's tokens per group: a lower
bound, timestamps not counted) and decoded bytes (grid frames x target width x height x 3,
at most). Each bound is checked on these numbers and refused as a 400 naming its setting.
A video whose container declares no duration is planned at nothing and decoded under what
the others leave (groups, tokens) and a share of the bytes in flight, refused at the first
bound it crosses.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gateway.intake.videos import refused
from iris.multimodal.video import VideoHeader, VideoLimits, VideoSampling

# Frames may run past a declared duration by up to 1 s (iris.multimodal.video): their grid
# frames are reserved too.
_SLACK_S = 1.0


@dataclass(frozen=True)
class VideoPlan:
    """One video's cost from its header; `groups` None when it declares no duration."""

    param: str
    header: VideoHeader
    size: tuple[int, int]  # (width, height) every frame is resized to
    groups: int | None
    tokens_per_group: int
    temporal_patch_size: int

    @property
    def tokens(self) -> int:
        return (self.groups or 0) * self.tokens_per_group

    @property
    def frame_bytes(self) -> int:
        return self.size[0] * self.size[1] * 3


def plan_video(
    header: VideoHeader, param: str, limits: VideoLimits, sampling: VideoSampling, adapter
) -> VideoPlan:
    """One video's plan; a 400 for a duration, frame size or group count over its bound."""
    if header.duration_s is not None and header.duration_s > limits.max_duration_s:
        raise refused(
            f"{param}: video declares {header.duration_s:.1f} s, over the limit of "
            f"{limits.max_duration_s} s",
            param,
            "video_max_duration_s",
        )
    pixels = header.width * header.height
    if pixels > limits.max_frame_pixels:
        raise refused(
            f"{param}: video frame is {header.width}x{header.height} = {pixels} pixels, over "
            f"the limit of {limits.max_frame_pixels}",
            param,
            "video_max_frame_pixels",
        )
    size = sampling.resized(header.width, header.height)
    frames = header.grid_frames(sampling)
    groups = None if frames is None else frames // sampling.temporal_patch_size
    if groups is not None and groups > limits.max_groups:
        raise refused(
            f"{param}: video's {header.duration_s:.1f} s make {groups} frame groups at "
            f"{sampling.fps:g} fps, over the limit of {limits.max_groups}",
            param,
            "video_max_groups",
        )
    tokens_per_group, _ = adapter.video_group_token_count(*size)
    patch = sampling.temporal_patch_size
    return VideoPlan(param, header, size, groups, int(tokens_per_group), patch)


def check_plans(
    plans: list[VideoPlan],
    limits: VideoLimits,
    tokens_left: int | None,
    decoded_bytes: list[int],
    inflight_limit: int,
) -> None:
    """400 when the request's videos together make more groups than `video_max_groups`,
    more tokens than the context has left after the text and images, or more decoded bytes
    (`decoded_bytes`, each video's `decoded_bytes_bound`) than the gateway may hold in all
    (`video_max_inflight_bytes`): they are reserved together, so no wait could let them in."""
    groups = sum(plan.groups or 0 for plan in plans)
    if groups > limits.max_groups:
        raise refused(
            f"request has {groups} video frame groups, over the limit of {limits.max_groups}",
            "messages",
            "video_max_groups",
        )
    tokens = sum(plan.tokens for plan in plans)
    if tokens_left is not None and tokens >= tokens_left:
        raise refused(
            f"the request's videos make {groups} frame groups of at least {tokens} tokens, "
            f"over the {max(tokens_left, 0)} tokens the model's context has left after the "
            "text and images",
            "messages",
            "max_model_len",
            "context_length_exceeded",
        )
    needed = sum(decoded_bytes)
    if needed > inflight_limit:
        raise refused(
            f"the request's videos would take {needed} bytes once decoded "
            f"({' + '.join(str(each) for each in decoded_bytes)}), over the limit of "
            f"{inflight_limit}",
            "messages",
            "video_max_inflight_bytes",
        )


def decoded_bytes_bound(plan: VideoPlan, limits: VideoLimits, fps: float, share: int) -> int:
    """The bytes the video's kept frames may take: the grid frames up to its declared length
    and the slack past it (t = k/fps <= duration + 1 s) x the frame's bytes; without a
    duration, what `max_frames` allow, at most `share` (the in-flight bound over the videos
    a request may hold: one such video never takes the whole gateway's bound)."""
    if plan.header.duration_s is None:
        return min(share, limits.max_frames * plan.frame_bytes)
    frames = math.floor((plan.header.duration_s + _SLACK_S) * fps) + 1
    return min(frames, limits.max_frames) * plan.frame_bytes


def decode_limits(
    plan: VideoPlan,
    plans: list[VideoPlan],
    limits: VideoLimits,
    tokens_left: int | None,
    reserved: int,
) -> VideoLimits:
    """The limits one video is decoded under: the groups the request's other videos leave
    (by their plans), the groups the context's tokens leave, and the bytes reserved."""
    others = [other for other in plans if other is not plan]
    max_groups = limits.max_groups - sum(other.groups or 0 for other in others)
    setting = "video_max_groups"
    if tokens_left is not None:
        left = tokens_left - 1 - sum(other.tokens for other in others)
        by_tokens = left // max(1, plan.tokens_per_group)
        if by_tokens < max_groups:
            max_groups, setting = by_tokens, "max_model_len"
    return dataclasses.replace(
        limits,
        max_groups=max(0, max_groups),
        groups_setting=setting,
        max_decoded_bytes=reserved,
    )
