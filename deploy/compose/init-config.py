"""The compose set-up's config job: puts turnkeep.yaml into the config volume that the workers
and the codec server mount at /etc/turnkeep, and generates turnkeep.secrets.yaml beside it the
first time (an AES-256 payload key, a codec-server token and the HTTP gateway's API key). Later
runs keep the secrets, so histories written earlier stay readable; `docker compose down -v`
deletes them with the rest."""

import base64
import os
import secrets
import shutil
from pathlib import Path

# Overridable so tests/test_deploy.py can run this very script on a temporary directory.
SOURCE = Path(os.environ.get("TURNKEEP_CONFIG_SOURCE", "/init/turnkeep.yaml"))
ETC = Path(os.environ.get("TURNKEEP_CONFIG_DIR", "/etc/turnkeep"))
SECRETS = ETC / "turnkeep.secrets.yaml"


def gateway_key() -> str:
    return f'gateway:\n  keys:\n    admin:\n      key: "{secrets.token_urlsafe(32)}"\n'


shutil.copyfile(SOURCE, ETC / "turnkeep.yaml")
if SECRETS.exists():
    print(f"{SECRETS} exists; keeping its key and token")
    # A secrets file from before the gateway: its key is added, the rest kept.
    if "\ngateway:" not in "\n" + SECRETS.read_text():
        with SECRETS.open("a") as out:
            out.write(gateway_key())
        print(f"added the gateway's API key to {SECRETS}")
else:
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    token = secrets.token_urlsafe(32)
    text = f"encryption:\n  keys:\n    compose-1: {key}\n  codec_server:\n    token: {token}\n"
    text += gateway_key()
    # Created readable by its owner only (the image's turnkeep user, as every service runs).
    fd = os.open(SECRETS, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    print(f"generated {SECRETS} (read the codec-server token and the gateway key there)")
