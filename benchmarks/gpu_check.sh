#!/usr/bin/env bash
# benchmarks/gpu_check.sh OUTDIR: the GPU check of issue 15 on a CUDA machine, in under 6 minutes.
#
#   1. the environment: Python, CuPy, numba-cuda and the engine's probe (OUTDIR/env.txt);
#   2. the GPU tests (`pytest -m gpu`): every CUDA kernel and the CUDA backend against the CPU
#      backend on fresh random inputs, offloaded models' greedy text against -ngl 0
#      (OUTDIR/gpu_tests.txt);
#   3. the benchmark (benchmarks/gpu_bench.py): pp512, tg128 and time to first token at -ngl
#      all / half / 0 for both starter models, or stand-ins of their shapes when the models are
#      not on the machine (LLAMATUI_MODELS=DIR points at them) (OUTDIR/gpu_bench.{json,md,log});
#   4. a short table last: the tests' outcome, the figures and the issue's targets.
#
# It installs nothing: it uses the CuPy and numba-cuda the machine has (pip install -e '.[gpu]'
# or '.[gpu-cuda13]' elsewhere) and imports llamatui from this checkout.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_check.sh OUTDIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
start=$(date +%s)

# llamatui from this checkout, as tools/wt-new arranges it (a package folder of links)
pkg=$(mktemp -d)
mkdir -p "$pkg/llamatui" && touch "$pkg/llamatui/__init__.py"
for d in app inference models quantizer; do ln -s "$repo/$d" "$pkg/llamatui/$d"; done
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# fresh random inputs for the checks, recorded so that a failure can be replayed
export LLAMATUI_CHECK_SEED=${LLAMATUI_CHECK_SEED:-$RANDOM}

echo "== environment" | tee "$out/env.txt"
"$py" - <<'EOF' 2>&1 | tee -a "$out/env.txt"
import importlib, os, platform
print("python", platform.python_version(), "check seed", os.environ["LLAMATUI_CHECK_SEED"])
for name in ("numpy", "numba", "numba_cuda", "cupy", "regex", "jinja2", "psutil",
             "threadpoolctl", "pytest"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "MISSING:", e)
from llamatui.inference.cuda import probe
print(probe().describe())
EOF
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv \
    2>&1 | tee -a "$out/env.txt"

echo "== GPU tests"
# only the files with gpu tests, without conftest.py (its fixtures download starter models and
# need packages the GPU image lacks; the gpu tests use none of them)
mapfile -t files < <(grep -l "pytest.mark.gpu" "$repo"/tests/test_*.py)
(cd "$repo/tests" && timeout 200 "$py" -m pytest --noconftest -p no:cacheprovider -m gpu -q \
    -rA "${files[@]}") 2>&1 | tee "$out/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}

echo "== benchmark"
left=$(( 340 - ($(date +%s) - start) ))
timeout $(( left > 60 ? left : 60 )) "$py" "$repo/benchmarks/gpu_bench.py" "$out" --reps 2 \
    --ngl all,half,0 ${LLAMATUI_MODELS:+--models "$LLAMATUI_MODELS"} 2>&1 | tee "$out/gpu_bench.log"
bench_rc=${PIPESTATUS[0]}

"$py" - "$out" "$tests_rc" "$bench_rc" "$(( $(date +%s) - start ))" <<'EOF'
import json, pathlib, re, sys
out, tests_rc, bench_rc, seconds = pathlib.Path(sys.argv[1]), *map(int, sys.argv[2:])
summary = [l for l in (out / "gpu_tests.txt").read_text().splitlines()
           if re.search(r"\d+ (passed|failed|skipped|error)", l)]
print(f"\n== gpu_check: {seconds} s; tests exit {tests_rc}: "
      f"{summary[-1].strip('= ') if summary else 'no summary'}; bench exit {bench_rc}")
rows = json.loads((out / "gpu_bench.json").read_text()) if (out / "gpu_bench.json").exists() else []
if (out / "gpu_bench.md").exists():
    print((out / "gpu_bench.md").read_text())
targets = []
for model, field, goal in (("smollm2-135m", "tg128", 500), ("smollm2-135m", "pp512", 10000),
                           ("gemma3-270m", "tg128", 300)):
    r = next((r for r in rows if r["model"] == model and r["ngl"] > 0
              and r["ngl"] == max(x["ngl"] for x in rows if x["model"] == model)), None)
    got = f"{r[field]:.0f}" if r else "not measured"
    if r and not r["n_gpu_layers"]:
        got += f" (on the CPU: {r['gpu_note'] or 'nothing offloaded'})"
    ok = r is not None and r["n_gpu_layers"] > 0 and r[field] >= goal
    targets.append(f"{model} all layers {field} >= {goal}: {got} {'PASS' if ok else 'FAIL'}")
for model in ("smollm2-135m", "gemma3-270m"):
    cpu = next((r for r in rows if r["model"] == model and r["ngl"] == 0), None)
    ngls = sorted({r["ngl"] for r in rows if r["model"] == model})
    half = next((r for r in rows if r["model"] == model and len(ngls) > 2 and r["ngl"] == ngls[1]),
                None)
    if cpu and half:
        ok = half["pp512"] > cpu["pp512"] and half["tg128"] > cpu["tg128"]
        targets.append(f"{model} partial (ngl {half['ngl']}) faster than CPU: pp "
                       f"{half['pp512'] / cpu['pp512']:.1f}x, tg {half['tg128'] / cpu['tg128']:.1f}x "
                       f"{'PASS' if ok else 'FAIL'}")
print("\n".join(targets))
(out / "targets.txt").write_text("\n".join(targets) + "\n")
EOF
