#!/usr/bin/env python3
"""Issue 15's speed targets, each as a ratio measured in one window.

Alternates, round after round, LangGraph + SqliteSaver (durability sync, from
../shared/peers) with `cargo bench --bench turn`, so that a slow stretch of the shared
machine hits both sides of a ratio:

  - per tool call at K = 50 against LangGraph (over loopback HTTP and in process), target <= 0.25;
  - flat in history: K = 200 against K = 10, target <= 1.2;
  - fifty concurrent sessions against one (the bench's own interleaved rounds), target >= 2.

LangGraph runs before and after each round of ours; the round's baseline is the mean of the
two. Writes a markdown report (stdout, and --out when given).

    python3 bench/turn_vs_peers.py --rounds 8 --out bench/results/turn-vs-peers.md
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build_bench():
    """The turn bench's executable (built with `cargo bench --no-run`)."""
    out = subprocess.run(
        ["cargo", "bench", "--locked", "--bench", "turn", "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "turn" \
                and msg.get("executable"):
            return msg["executable"]
    sys.exit("turn_vs_peers: cargo did not report the turn bench's executable")


def peers_python(peers, venv):
    """The peers' interpreter, its virtualenv made from their pinned requirements if missing."""
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        log(f"creating {venv} from {peers}/requirements.txt")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r",
                        str(Path(peers) / "requirements.txt")], check=True)
    return str(python)


def langgraph(python, peers, db_dir, k):
    """LangGraph + SqliteSaver (sync durability): median ms per tool call of its 5 runs."""
    r = subprocess.run(
        [python, "lg_bench.py", "--mode", "sqlite-sync", "--api", "sync", "--conc", "1", "--k", str(k)],
        cwd=peers, env=dict(os.environ, BENCH_DB_DIR=db_dir), capture_output=True, text=True,
        timeout=900,
    )
    if r.returncode != 0:
        sys.exit(f"turn_vs_peers: lg_bench.py failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["median_ms_per_call"]


def field(pattern, text, what):
    m = re.search(pattern, text)
    if not m:
        sys.exit(f"turn_vs_peers: the turn bench printed no {what}:\n{text[-2000:]}")
    return m


def ours(exe, k, sessions, concurrent, in_process=False):
    """(ms per tool call, p50; median fifty-against-one ratio or None) of one bench process."""
    env = dict(os.environ, BENCH_K=str(k), BENCH_SESSIONS=str(sessions),
               BENCH_CONCURRENT=str(concurrent))
    env.pop("BENCH_MODEL", None)
    if in_process:
        env["BENCH_MODEL"] = "in-process"
    r = subprocess.run([exe, "--bench"], env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"turn_vs_peers: the turn bench failed:\n{r.stdout[-1000:]}\n{r.stderr[-2000:]}")
    per_call = float(field(r"per tool call, p50 over \d+ sessions \| ([\d.]+) ms", r.stdout,
                           "per tool call figure").group(1))
    ratio = None
    if concurrent:
        ratio = float(field(r"against one, each round .*\(median ([\d.]+)\)", r.stdout,
                            "fifty-against-one ratio").group(1))
    return per_call, ratio


def summary(name, values, target, better, digits=2):
    met = sum(1 for v in values if better(v, target))
    med, lo, hi = statistics.median(values), min(values), max(values)
    return (f"| {name} | {med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f}) "
            f"| {target} | {met}/{len(values)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peers", default=str(ROOT.parent / "shared" / "peers"))
    ap.add_argument("--venv", default="/tmp/peerbench/venv")
    ap.add_argument("--db-dir", default="/tmp/peerbench/db")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    if args.rounds < 1:
        sys.exit("turn_vs_peers: --rounds must be at least 1")
    if not (Path(args.peers) / "lg_bench.py").exists():
        sys.exit(f"turn_vs_peers: no lg_bench.py in {args.peers} (--peers)")
    os.makedirs(args.db_dir, exist_ok=True)
    python = peers_python(args.peers, args.venv)
    exe = build_bench()
    rows = []
    for rnd in range(1, args.rounds + 1):
        before = langgraph(python, args.peers, args.db_dir, 50)
        http, http_ratio = ours(exe, 50, 5, 50)
        inproc, inproc_ratio = ours(exe, 50, 5, 50, in_process=True)
        k10, _ = ours(exe, 10, 20, 0)
        k200, _ = ours(exe, 200, 3, 0)
        after = langgraph(python, args.peers, args.db_dir, 50)
        lg = (before + after) / 2
        row = {"round": rnd, "lg": lg, "http": http, "inproc": inproc,
               "http_vs_lg": http / lg, "inproc_vs_lg": inproc / lg,
               "flat": k200 / k10, "k10": k10, "k200": k200,
               "http_ratio": http_ratio, "inproc_ratio": inproc_ratio}
        rows.append(row)
        log(json.dumps(row))
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         capture_output=True, text=True).stdout.strip() or "?"
    lines = [
        f"## {datetime.date.today()}, {rev}: {args.rounds} rounds "
        f"({os.cpu_count()} cores, kernel {platform.release()})",
        "",
        "`python3 bench/turn_vs_peers.py` — LangGraph + SqliteSaver (sync) K = 50 before and "
        "after each round (its baseline is their mean); ours: `cargo bench --bench turn`, "
        "embedded durable backend, zero-latency scripted model.",
        "",
        "| round | LangGraph ms/call | ours HTTP ms/call | × LG | ours in process | × LG "
        "| K=10 | K=200 | K200/K10 | 50/1 HTTP | 50/1 in process |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['round']} | {r['lg']:.2f} | {r['http']:.2f} | {r['http_vs_lg']:.3f} "
            f"| {r['inproc']:.2f} | {r['inproc_vs_lg']:.3f} | {r['k10']:.2f} | {r['k200']:.2f} "
            f"| {r['flat']:.2f} | {r['http_ratio']:.2f} | {r['inproc_ratio']:.2f} |")
    le = lambda v, t: v <= t
    ge = lambda v, t: v >= t
    lines += [
        "",
        "| target | median (range) | bound | rounds met |",
        "| --- | --- | --- | --- |",
        summary("per tool call against LangGraph, over HTTP", [r["http_vs_lg"] for r in rows], 0.25, le, 3),
        summary("per tool call against LangGraph, in process", [r["inproc_vs_lg"] for r in rows], 0.25, le, 3),
        summary("K = 200 against K = 10", [r["flat"] for r in rows], 1.2, le),
        summary("fifty sessions against one, over HTTP", [r["http_ratio"] for r in rows], 2.0, ge),
        summary("fifty sessions against one, in process", [r["inproc_ratio"] for r in rows], 2.0, ge),
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        out = Path(args.out)
        head = "" if out.exists() else (
            "# Turn speed against the peers (issue 15), one window per section\n\n"
            "Written by `bench/turn_vs_peers.py`; each section is one run, newest last.\n\n")
        with out.open("a") as f:
            f.write(head + report + "\n")


if __name__ == "__main__":
    main()
