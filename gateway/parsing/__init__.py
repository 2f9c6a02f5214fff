"""Request bodies parsed off the event loop: a pool of worker processes (docs/design/door.md)."""
