"""Request bodies parsed off the event loop: a pool of worker processes (docs/design.md §3.6)."""
