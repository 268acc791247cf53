#!/usr/bin/env bash
# Regenerates cudnn-sys/src/bindings.rs from the cuDNN 9.14.0 headers.
# Needs: python3 with pip (to fetch the header wheels) and libclang (Debian: apt-get install libclang-dev).
# Headers come from the PyPI wheels nvidia-cudnn-cu13==9.14.0.64 (cuDNN) plus nvidia-cuda-runtime and
# nvidia-cuda-crt (the CUDA runtime headers cudnn.h includes). Set CUDNN_SAFE_WHEEL_DIR to reuse an
# unpacked copy (the directory holding nvidia/cudnn/include and nvidia/cu13/include).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${CUDNN_SAFE_WHEEL_DIR:-$here/../target/cudnn-headers}
if [ ! -f "$dir/nvidia/cudnn/include/cudnn.h" ] || [ ! -f "$dir/nvidia/cu13/include/cuda_runtime_api.h" ]; then
  mkdir -p "$dir/wheels"
  python3 -m pip download --no-deps -d "$dir/wheels" \
    nvidia-cudnn-cu13==9.14.0.64 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
  for w in "$dir"/wheels/*.whl; do python3 -m zipfile -e "$w" "$dir"; done
fi
cargo run --release --manifest-path "$here/gen/Cargo.toml" -- \
  "$dir/nvidia/cudnn/include" "$dir/nvidia/cu13/include" "$here/src/bindings.rs"
rustfmt --edition 2021 "$here/src/bindings.rs"
