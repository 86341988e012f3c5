"""The compose set-up's config job: puts turnkeep.yaml into the config volume that the workers
and the codec server mount at /etc/turnkeep, and generates turnkeep.secrets.yaml beside it the
first time (an AES-256 payload key and a codec-server token). Later runs keep the secrets, so
histories written earlier stay readable; `docker compose down -v` deletes them with the rest."""

import base64
import os
import secrets
import shutil
from pathlib import Path

# Overridable so tests/test_deploy.py can run this very script on a temporary directory.
SOURCE = Path(os.environ.get("TURNKEEP_CONFIG_SOURCE", "/init/turnkeep.yaml"))
ETC = Path(os.environ.get("TURNKEEP_CONFIG_DIR", "/etc/turnkeep"))
SECRETS = ETC / "turnkeep.secrets.yaml"

shutil.copyfile(SOURCE, ETC / "turnkeep.yaml")
if SECRETS.exists():
    print(f"{SECRETS} exists; keeping its key and token")
else:
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    token = secrets.token_urlsafe(32)
    text = f"encryption:\n  keys:\n    compose-1: {key}\n  codec_server:\n    token: {token}\n"
    # Created readable by its owner only (the image's turnkeep user, as every service runs).
    fd = os.open(SECRETS, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    print(f"generated {SECRETS} (read the codec-server token there)")
