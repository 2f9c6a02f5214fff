"""Giving each embedding its own storage, so a stored item never pins its batch's buffer."""

from __future__ import annotations


def owned_cpu(tensor):
    """`tensor` detached, on the CPU, C-contiguous and owning exactly its own bytes.

    A device tensor is copied to the host (a fresh allocation). A host tensor that is a
    view — a row slice of the batch output, say — is cloned, because keeping the view
    would keep the whole batch buffer alive for as long as the item is held.
    """
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        return tensor.to("cpu").contiguous()
    if owns_storage(tensor):
        return tensor
    return tensor.contiguous().clone()


def owns_storage(tensor) -> bool:
    """True when the tensor is C-contiguous and its storage holds nothing but its data."""
    size = tensor.numel() * tensor.element_size()
    return (
        tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == size
    )
