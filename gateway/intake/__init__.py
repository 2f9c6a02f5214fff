"""Request intake (docs/design.md §3 step 1): image bytes, headers, identities, template,
tokens, expansion and sentinel padding — everything before routing, with no torch."""
