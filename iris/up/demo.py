"""The demo request `iris up --demo-request` sends: one chat with an image, through HTTP."""

from __future__ import annotations

import base64
import io

import httpx


def demo_image_png() -> bytes:
    """A small picture made here (nothing is downloaded): a red square on blue."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (320, 240), (30, 60, 200))
    ImageDraw.Draw(image).rectangle((100, 60, 220, 180), fill=(220, 30, 30))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def demo_chat_body(model: str, question: str = "What is in this picture?") -> dict:
    data_url = "data:image/png;base64," + base64.b64encode(demo_image_png()).decode()
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url}},
                    {"type": "text", "text": question},
                ],
            }
        ],
        "max_tokens": 32,
        "temperature": 0,
    }


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def send_demo_requests(
    gateway_url: str, timeout_s: float = 120.0, api_key: str | None = None
) -> list[tuple[str, dict]]:
    """POST the demo chats — one with an image, one text question — and return
    (description, parsed response) pairs. The demo model's vision tower is random, so the
    image answer shows the path works, not that the model sees; the text one is sensible."""
    model = served_model(gateway_url, api_key)
    text_body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32,
        "temperature": 0,
    }
    replies = []
    for description, body in (
        ("an image + 'What is in this picture?'", demo_chat_body(model)),
        ("'What is the capital of France?'", text_body),
    ):
        response = httpx.post(
            f"{gateway_url}/v1/chat/completions",
            json=body,
            headers=_headers(api_key),
            timeout=timeout_s,
        )
        response.raise_for_status()
        replies.append((description, response.json()))
    return replies


def served_model(gateway_url: str, api_key: str | None = None) -> str:
    """The model id the gateway serves (what clients put in "model")."""
    reply = httpx.get(f"{gateway_url}/v1/models", headers=_headers(api_key), timeout=10)
    return reply.json()["data"][0]["id"]


def examples(gateway_url: str, model: str, keyed: bool = False) -> str:
    """The curl and openai-client examples `iris up` prints (with `keyed`, they read the
    key from $IRIS_API_KEY: the key itself is never printed)."""
    header = ' -H "Authorization: Bearer $IRIS_API_KEY"' if keyed else ""
    client_key = 'os.environ["IRIS_API_KEY"]' if keyed else '"unused"'
    return f"""\
Try it:
  curl -s {gateway_url}/v1/chat/completions -H 'Content-Type: application/json'{header} \\
    -d '{{"model": "{model}", "max_tokens": 32,
         "messages": [{{"role": "user", "content": "What is the capital of France?"}}]}}'

  python - <<'PY'
  import os
  from openai import OpenAI
  client = OpenAI(base_url="{gateway_url}/v1", api_key={client_key})
  reply = client.chat.completions.create(
      model=client.models.list().data[0].id,
      messages=[{{"role": "user", "content": "What is the capital of France?"}}],
  )
  print(reply.choices[0].message.content)
  PY"""
