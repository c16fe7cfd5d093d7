#!/usr/bin/env bash
# `make serve`'s fast CPU path (issue 28): MLX's Linux CPU wheel computes on a slow reference BLAS
# unless OpenBLAS is there to preload (src/blas.py; 2-15x faster prefill and decode). On Debian
# or Ubuntu as root, install it (libopenblas0-pthread); anywhere else say what to run and go on:
# the server works without it, and its start-up line says which BLAS it uses.
set -uo pipefail
[ "$(uname -s)" = "Linux" ] || exit 0
if ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so\.0'; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing OpenBLAS (libopenblas0-pthread) for MLX's CPU backend"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update -qq && apt-get install -y -qq --no-install-recommends libopenblas0-pthread >/dev/null; then
    exit 0
  fi
  echo "could not install libopenblas0-pthread; serving on the reference BLAS" >&2
  exit 0
fi
echo "OpenBLAS is missing: MLX will use the slow reference BLAS. For 2-15x faster prefill and" >&2
echo "decode run, as root: apt-get install libopenblas0-pthread (Debian/Ubuntu)" >&2
exit 0
