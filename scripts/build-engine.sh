#!/usr/bin/env bash
# Build llama.cpp's llama-server from the sources vendored in the llama-cpp-python sdist, once per
# machine, into the engine cache (ENGINE_CACHE, default ~/.cache/shadow-gateway). Never a binary
# download, never a model download: the server is built without HTTPS or a prebuilt web UI.
#
#   scripts/build-engine.sh PYTHON    # prints the path of llama-server
#
# Portable flags: GGML_NATIVE=OFF keeps the binary off this CPU's particular extensions (it uses
# AVX2, FMA and F16C on x86-64, the x86-64-v3 level), so one build serves every machine of a kind.
set -euo pipefail

PY=${1:-python3}
VERSION=0.3.36
CACHE=${ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shadow-gateway}
DEST="$CACHE/llama.cpp-$VERSION"
SERVER="$DEST/bin/llama-server"

if [ -x "$SERVER" ] && "$SERVER" --version >/dev/null 2>&1; then
    echo "$SERVER"
    exit 0
fi

command -v cmake >/dev/null || { echo "cmake is needed to build llama-server" >&2; exit 1; }
command -v c++ >/dev/null || { echo "a C++ compiler is needed to build llama-server" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/llama-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "building llama-server $VERSION into $DEST (about 10 minutes on 2 cores)" >&2
"$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$WORK" "llama-cpp-python==$VERSION" >&2
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$WORK/configure.log" 2>&1 \
    || { cat "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >"$WORK/build.log" 2>&1 \
    || { tail -50 "$WORK/build.log" >&2; exit 1; }

mkdir -p "$DEST.tmp/bin"
cp "$WORK/build/bin/llama-server" "$DEST.tmp/bin/"
cp "$SRC/LICENSE" "$DEST.tmp/LICENSE"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "$SERVER"
