"""The HTTP surface: one router per resource, errors in OpenAI's shape."""
