"""The last part of benchmarks/gpu_check.sh: issue 28's targets against what the run measured.

    python benchmarks/gpu_check_report.py OUTDIR [TESTS_RC BENCH_RC SECONDS]

Reads OUTDIR/gpu_tests.txt (pytest's summary), OUTDIR/gpu_bench.json (gpu_bench.py's rows) and
OUTDIR/llama-bench.jsonl (llama.cpp's llama-bench -o jsonl on the same files, -ngl 99), prints
our table, llama.cpp's figures, then the targets and ratios (last), and writes them to
OUTDIR/targets.txt and OUTDIR/ratios.json. Targets (issue 28, "Done when"), per model:

- fully offloaded tg128 >= 1.2x and pp512 >= 1.0x llama.cpp's;
- time to first token of a 128-token prompt <= llama.cpp's, taken as llama-bench's pp128 time
  (128 / its pp128 tokens per second: the prompt's forward pass, which gives the first token's
  logits);
- half offloaded >= 1.3x the CPU alone (-ngl 0, same run), tg128 and pp512.

A figure that is missing (a phase timed out, llama.cpp did not build) is "not measured", never a
pass.
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
TG_VS_LLAMA, PP_VS_LLAMA, HALF_VS_CPU = 1.2, 1.0, 1.3


def tests_summary(out: pathlib.Path) -> str:
    path = out / "gpu_tests.txt"
    lines = [line for line in path.read_text(errors="replace").splitlines()
             if re.search(r"\d+ (passed|failed|skipped|error)", line)] if path.is_file() else []
    return lines[-1].strip("= ") if lines else "no summary"


def llama_figures(out: pathlib.Path) -> dict[str, dict[str, float]]:
    """{file name: {"pp512": t/s, "pp128": t/s, "tg128": t/s}} from llama-bench's jsonl."""
    path = out / "llama-bench.jsonl"
    figures: dict[str, dict[str, float]] = {}
    if not path.is_file():
        return figures
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line of a run cut short
        if not isinstance(record, dict) or "avg_ts" not in record:
            continue
        n_prompt, n_gen = int(record.get("n_prompt", 0)), int(record.get("n_gen", 0))
        test = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}" if n_prompt == 0 else None
        if test:
            name = pathlib.Path(str(record.get("model_filename", ""))).name
            figures.setdefault(name, {})[test] = float(record["avg_ts"])
    return figures


def _row(rows, model, pick):
    """The model's row at -ngl `pick`: "all" (the most layers), "half" (between), "cpu" (0)."""
    mine = sorted((r for r in rows if r["model"] == model), key=lambda r: r["ngl"])
    if not mine:
        return None
    if pick == "cpu":
        return next((r for r in mine if r["ngl"] == 0), None)
    on_gpu = [r for r in mine if r["ngl"] > 0]
    if pick == "all":
        return on_gpu[-1] if on_gpu else None
    return on_gpu[0] if len(on_gpu) > 1 else None


def _verdict(ratio, goal) -> str:
    return "not measured" if ratio is None else f"{ratio:.2f}x {'PASS' if ratio >= goal else 'FAIL'}"


def _ratio(a, b):
    return a / b if a and b else None


def targets(rows, llama) -> tuple[list[str], dict]:
    lines, ratios = [], {}
    for model in dict.fromkeys(r["model"] for r in rows):
        full, half, cpu = (_row(rows, model, p) for p in ("all", "half", "cpu"))
        peer = llama.get(pathlib.Path(full["file"]).name, {}) if full and full.get("file") \
            else {}
        offloaded = full is not None and full["n_gpu_layers"] > 0
        if full is not None and not offloaded:
            lines.append(f"{model}: nothing offloaded ({full.get('gpu_note') or 'no GPU'})")
        r = ratios[model] = {
            "tg128_vs_llama": _ratio(full and offloaded and full["tg128"], peer.get("tg128")),
            "pp512_vs_llama": _ratio(full and offloaded and full["pp512"], peer.get("pp512")),
            # above 1: our first token comes sooner
            "ttft_vs_llama": _ratio(peer.get("pp128") and 128e3 / peer["pp128"],
                                    full and offloaded and full["ttft_ms"]),
            "half_tg128_vs_cpu": _ratio(half and half["tg128"], cpu and cpu["tg128"]),
            "half_pp512_vs_cpu": _ratio(half and half["pp512"], cpu and cpu["pp512"])}
        llama_ttft = f"{128e3 / peer['pp128']:.1f} ms" if peer.get("pp128") else "-"
        ours_ttft = f"{full['ttft_ms']:.1f} ms" if full else "-"
        lines += [
            (f"{model} all layers tg128 >= {TG_VS_LLAMA}x llama.cpp: "
             f"{_verdict(r['tg128_vs_llama'], TG_VS_LLAMA)}"),
            (f"{model} all layers pp512 >= {PP_VS_LLAMA}x llama.cpp: "
             f"{_verdict(r['pp512_vs_llama'], PP_VS_LLAMA)}"),
            (f"{model} time to first token (128 tokens) <= llama.cpp's (ratio theirs / ours): "
             f"ours {ours_ttft}, "
             f"llama.cpp {llama_ttft}: {_verdict(r['ttft_vs_llama'], 1.0)}"),
            (f"{model} half offloaded (ngl {half['ngl'] if half else '-'}) tg128 >= "
             f"{HALF_VS_CPU}x the CPU alone: {_verdict(r['half_tg128_vs_cpu'], HALF_VS_CPU)}"),
            (f"{model} half offloaded pp512 >= {HALF_VS_CPU}x the CPU alone: "
             f"{_verdict(r['half_pp512_vs_cpu'], HALF_VS_CPU)}")]
    return lines, ratios


def llama_table(rows, llama) -> str:
    lines = ["| model | llama.cpp pp512 t/s | pp128 t/s | tg128 t/s |", "|---|--:|--:|--:|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        full = _row(rows, model, "all")
        peer = llama.get(pathlib.Path(full["file"]).name, {}) if full and full.get("file") \
            else {}
        cells = [f"{peer[t]:.0f}" if t in peer else "-" for t in ("pp512", "pp128", "tg128")]
        lines.append(f"| {model} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv) -> int:
    if not argv or len(argv) not in (1, 4):
        sys.exit(__doc__)
    out = pathlib.Path(argv[0])
    sys.path.insert(0, str(HERE))
    from gpu_bench import table
    saved = out / "gpu_bench.json"
    rows = json.loads(saved.read_text()) if saved.is_file() else []
    order = {m: i for i, m in enumerate(dict.fromkeys(r["model"] for r in rows))}
    rows.sort(key=lambda r: (order[r["model"]], -r["ngl"]))  # -ngl all came first, the rest later
    llama = llama_figures(out)
    if len(argv) == 4:
        tests_rc, bench_rc, seconds = map(int, argv[1:])
        peer = f"{len(llama)} file(s) measured" if llama else "not measured"
        print(f"\n== gpu_check: {seconds} s; tests exit {tests_rc}: {tests_summary(out)}; "
              f"bench exit {bench_rc}; llama-bench: {peer}")
    if rows:
        print(table(rows))
        print()
        print(llama_table(rows, llama))
    lines, ratios = targets(rows, llama)
    if not rows:
        lines = ["no benchmark rows (gpu_bench.json): nothing measured"]
    print("\n" + "\n".join(lines))
    (out / "targets.txt").write_text("\n".join(lines) + "\n")
    (out / "ratios.json").write_text(json.dumps(ratios, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
