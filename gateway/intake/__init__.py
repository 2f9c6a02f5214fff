"""Request intake (docs/design/gateway.md): image bytes, headers, identities, template,
tokens, expansion and sentinel padding — everything before routing, with no torch."""
