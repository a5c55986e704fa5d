#!/usr/bin/env bash
# benchmarks/gpu_check.sh OUTDIR: issue 28's GPU check on a CUDA machine, in one run of at most
# 8 minutes (CHECK_S, default 470 s: every phase's timeout is cut to what is left).
#
#   1. llama.cpp's CUDA llama-bench is built first, in the background (nice'd), from the source
#      tarball of make_llama_src.sh (LLAMA_SRC, else llama-src.tgz in shared/device/ of the
#      checkout or of its parent), as llamacpp_cuda_bench.sh builds it (~3 minutes on 16 cores;
#      BUILD_S caps it, and so does what the rest of the run needs after it); LLAMA_BENCH=PATH
#      uses a built one instead (OUTDIR/llama-build.log);
#   2. the environment: Python, CuPy, numba-cuda and the engine's probe (OUTDIR/env.txt);
#   3. the model files (OUTDIR/models, while the tests run): stand-ins of the starter models'
#      shapes (gpu_models.py; the real files from LLAMATUI_MODELS=DIR when there) and
#      Qwen2.5-0.5B's shape in the Q4_K_M mix (bench_archs.py);
#   4. the GPU tests (`pytest -m gpu`): every CUDA kernel and the CUDA backend against the CPU
#      backend on fresh random inputs, offloaded greedy text against -ngl 0, the decode step's
#      launch / sync / transfer budget (OUTDIR/gpu_tests.txt);
#   5. ours (benchmarks/gpu_bench.py): pp512, tg128 and time to first token, -ngl all while
#      llama.cpp builds (those rows hardly use the CPU), then, once the build has left the
#      cores, llama-bench on the same files (-ngl 99, pp512, pp128, tg128; OUTDIR/llama-bench.*)
#      and -ngl half and 0 (the CPU's rows) (OUTDIR/gpu_bench.{json,md,log});
#   6. the report last (gpu_check_report.py): the tables, then the issue's targets as ratios
#      (OUTDIR/targets.txt, OUTDIR/ratios.json).
#
# GPU_CHECK_DRY=1 runs what needs no GPU (the environment, the model files, the report on
# whatever OUTDIR holds) and skips the build, the tests and the benchmarks.
# It installs nothing: it uses the CuPy and numba-cuda the machine has (pip install -e '.[gpu]'
# or '.[gpu-cuda13]' elsewhere) and imports llamatui from this checkout.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
dry=${GPU_CHECK_DRY:-0}
budget=${CHECK_S:-470}
mkdir -p "$out" && out=$(cd "$out" && pwd)
start=$(date +%s)

elapsed() { echo $(( $(date +%s) - start )); }
stamp() { echo "== [$(elapsed)s] $*"; }
# seconds a phase may take: at most $1, leaving $2 for what follows, at least 10
allow() {
    local room=$(( budget - $(elapsed) - ${2:-0} ))
    (( room > $1 )) && room=$1
    (( room < 10 )) && room=10
    echo "$room"
}

# llamatui from this checkout, as tools/wt-new arranges it (a package folder of links)
pkg=$(mktemp -d)
mkdir -p "$pkg/llamatui" && touch "$pkg/llamatui/__init__.py"
for d in app inference models quantizer; do ln -s "$repo/$d" "$pkg/llamatui/$d"; done
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# fresh random inputs for the checks, recorded so that a failure can be replayed
export LLAMATUI_CHECK_SEED=${LLAMATUI_CHECK_SEED:-$RANDOM}

# ---------------------------------------------------------------- 1. llama.cpp, in the background
build_llama() {  # SRC_TGZ DIR SECONDS: llama-bench with CUDA for sm_90 into DIR/b/bin
    local src=$1 dir=$2
    tar xzf "$src" -C "$dir" || return 1
    command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
    (cd "$dir" && nice -n 10 cmake -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
     && nice -n 10 timeout "$3" cmake --build b -j "$(nproc)" --target llama-bench)
}
llama_src=${LLAMA_SRC:-}
for c in "$repo/shared/device/llama-src.tgz" "$repo/../shared/device/llama-src.tgz"; do
    [ -z "$llama_src" ] && [ -f "$c" ] && llama_src=$c
done
llama_bench=${LLAMA_BENCH:-}
build_pid=
if [ -n "$llama_bench" ]; then
    note="llama-bench: $llama_bench (LLAMA_BENCH)"
elif [ "$dry" = 1 ]; then
    note="dry run: llama.cpp not built"
elif [ -z "$llama_src" ]; then
    note="no llama.cpp source: make it with ../shared/device/make_llama_src.sh DIR, then LLAMA_SRC=DIR/llama-src.tgz"
else
    note="building llama-bench from $llama_src"
    lldir=$(mktemp -d)
    llama_bench=$lldir/b/bin/llama-bench
    # what follows the build: llama-bench (~40 s), the CPU's rows (~140 s), the report
    build_llama "$llama_src" "$lldir" "$(allow "${BUILD_S:-300}" 190)" \
        > "$out/llama-build.log" 2>&1 &
    build_pid=$!
fi
stamp "llama.cpp: $note"
[ -n "$build_pid" ] || echo "$note" > "$out/llama-build.log"

# ---------------------------------------------------------------- 2. the environment
stamp "environment" | tee "$out/env.txt"
"$py" - <<'EOF' 2>&1 | tee -a "$out/env.txt"
import importlib, os, platform
print("python", platform.python_version(), "check seed", os.environ["LLAMATUI_CHECK_SEED"])
for name in ("numpy", "numba", "numba_cuda", "cupy", "regex", "jinja2", "psutil",
             "threadpoolctl", "platformdirs", "pytest"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "MISSING:", e)
from llamatui.inference.cuda import probe
print(probe().describe())
EOF
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv \
    2>&1 | tee -a "$out/env.txt"
echo "cores $(nproc)" | tee -a "$out/env.txt"

# ---------------------------------------------------------------- 3. the model files
stamp "model files (in the background)"
"$py" - "$repo" "$out/models" "${LLAMATUI_MODELS:-}" > "$out/models.log" 2>&1 <<'EOF' &
import pathlib, sys, tempfile, types
repo, models, real = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
sys.path[:0] = [str(repo / "benchmarks"), str(repo / "tests")]
try:
    import platformdirs  # noqa: F401 -- bench_archs names its cache folder with it
except ImportError:  # not on every GPU image; the cache folder is given here anyway
    sys.modules["platformdirs"] = types.SimpleNamespace(
        user_cache_dir=lambda *a, **k: tempfile.gettempdir())
from bench_archs import cached_model
from gpu_bench import model_paths
for name, path in model_paths(real or None, models).items():
    print(f"{name}={path}")
print(f"qwen2.5-0.5b={cached_model('qwen2.5-0.5b', models)}")
EOF
models_pid=$!

# ---------------------------------------------------------------- 4. the GPU tests
tests_rc=0
if [ "$dry" = 1 ]; then
    echo "dry run: no GPU tests" > "$out/gpu_tests.txt"
else
    stamp "GPU tests"
    # only the files with gpu tests, without conftest.py (its fixtures download starter models
    # and need packages the GPU image lacks; the gpu tests use none of them)
    mapfile -t files < <(grep -l "pytest.mark.gpu" "$repo"/tests/test_*.py)
    (cd "$repo/tests" && timeout "$(allow 200 240)" "$py" -m pytest --noconftest \
        -p no:cacheprovider -m gpu -q -rA "${files[@]}") 2>&1 | tee "$out/gpu_tests.txt"
    tests_rc=${PIPESTATUS[0]}
fi
wait "$models_pid"
models_rc=$?
grep -v "=" "$out/models.log" | tail -3
mapfile -t model_files < <(grep -E "^[a-z0-9.-]+=/" "$out/models.log")
stamp "models (exit $models_rc): ${model_files[*]}"
extra=()
for m in "${model_files[@]}"; do [[ $m == qwen2.5-0.5b=* ]] && extra+=(--model-file "$m"); done

# ---------------------------------------------------------------- 5. the benchmarks
bench_rc=0
bench() {  # NGL_SPECS RESERVE [--append]: our rows, within what is left
    local rc
    timeout "$(allow 400 "$2")" "$py" "$repo/benchmarks/gpu_bench.py" "$out" --reps 2 \
        --ngl "$1" ${LLAMATUI_MODELS:+--models "$LLAMATUI_MODELS"} "${extra[@]}" "${@:3}" \
        2>&1 | tee -a "$out/gpu_bench.log"
    rc=${PIPESTATUS[0]}
    (( rc )) && bench_rc=$rc
}
if [ "$dry" != 1 ]; then
    stamp "ours, -ngl all"
    : > "$out/gpu_bench.log"
    bench all 200
    if [ -n "$build_pid" ]; then
        stamp "waiting for llama.cpp's build (its timeout leaves the rest of the run its time)"
        wait "$build_pid"
        stamp "llama.cpp's build: exit $?"
        tail -3 "$out/llama-build.log"
    fi
    if [ -n "$llama_bench" ] && [ -x "$llama_bench" ]; then
        stamp "llama.cpp's llama-bench on the same files"
        : > "$out/llama-bench.jsonl"
        for m in "${model_files[@]}"; do
            timeout "$(allow 60 100)" "$llama_bench" -m "${m#*=}" -ngl 99 -p 512,128 -n 128 -r 3 \
                -fa 0 -o jsonl -oe md >> "$out/llama-bench.jsonl" 2>> "$out/llama-bench.md"
        done
        grep "^|" "$out/llama-bench.md"
    else
        stamp "llama.cpp not measured: no llama-bench (see $out/llama-build.log)"
    fi
    stamp "ours, -ngl half and 0"
    bench half,0 10 --append
fi

# ---------------------------------------------------------------- 6. the report
"$py" "$repo/benchmarks/gpu_check_report.py" "$out" "$tests_rc" "$bench_rc" "$(elapsed)"
