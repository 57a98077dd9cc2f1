#!/usr/bin/env bash
# A side environment for optimum-executorch, used by benchmarks/executorch_runtimes.py.
#
# optimum-executorch 1.1.0 (the newest on PyPI) pins transformers==5.0.0rc1 and optimum~=2.0.0, which clash
# with the project's transformers 5.23.0 (`pip install --dry-run optimum-executorch` in .venv would downgrade
# transformers and huggingface_hub), so it cannot be installed beside our pins. It lives in
# benchmarks/.venv-optimum-executorch instead: its own transformers, optimum and optimum-executorch
# (installed without dependencies, at the versions pip resolves for them), and the project's torch,
# executorch and torchao read from the project's .venv through a .pth file placed after its own
# site-packages, so both exporters lower with the same ExecuTorch and run in the same runtime.
#
# Usage: bash benchmarks/setup_optimum_executorch_env.sh [PYTHON]   (after `make .venv/.installed`)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv-optimum-executorch"
python="${1:-python3}"
project_site="$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
[ -f "$venv/.gitignore" ] || printf '*\n' > "$venv/.gitignore"

pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --no-deps \
    optimum-executorch==1.1.0 optimum==2.0.0 transformers==5.0.0rc1 huggingface_hub==1.33.0 tokenizers==0.22.2 \
    typer-slim==0.24.0 accelerate==1.16.0 httpx==0.29.0 httpcore==1.0.9 psutil
# the project's torch, executorch, torchao and the rest, after this venv's own packages
own_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$project_site" > "$own_site/zz_project_venv.pth"

HF_HUB_OFFLINE=1 "$venv/bin/python" - <<'PY'
from importlib import metadata

for name in ("torch", "executorch", "torchao", "transformers", "optimum", "optimum-executorch"):
    print(f"{name}=={metadata.version(name)}")
from optimum.exporters.executorch import main_export  # noqa: F401  (fails here if the env is broken)
PY
echo "optimum-executorch env ready: $venv"
