"""The gateway process never imports torch (it loads tokenizer and processor config only)."""

import subprocess
import sys


def test_building_the_app_and_preparing_a_prompt_imports_no_torch(tiny_qwen2_vl_dir):
    code = f"""
import asyncio, base64, io, sys
from PIL import Image
from gateway.app import create_app
from gateway.settings import GatewaySettings
settings = GatewaySettings.load(model={str(tiny_qwen2_vl_dir)!r})
app = create_app(settings)
buffer = io.BytesIO(); Image.new("RGB", (64, 64)).save(buffer, "PNG")
url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
message = {{"role": "user", "content": [{{"type": "image_url", "image_url": {{"url": url}}}}]}}
prompt = asyncio.run(app.state.gateway.prompts.chat([message]))
assert prompt.items and prompt.image_tokens > 0
heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "triton"))
print(heavy)
sys.exit(1 if heavy else 0)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
