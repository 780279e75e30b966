"""Shared by the A/B scripts in bench/ (f32_linear.py, amx_prefetch.py, batch1_context.py, ...): time arms in alternating rounds
(sorted by the memory's phase, where it matters), and append or write their rows to OUT/NAME.csv and their lines to OUT/NAME.txt.
Not part of CI."""
import csv, statistics, time
from pathlib import Path

def alternate(arms: dict, rounds: int) -> tuple[dict, dict]:
    "Each arm (name -> function) warmed once, then timed once per round, the order flipping every round: medians and fastest, ms."
    for f in arms.values(): f()
    times = {name: [] for name in arms}
    for r in range(rounds):
        for name, f in (arms.items() if r % 2 == 0 else list(arms.items())[::-1]):
            t = time.perf_counter(); f(); times[name].append(time.perf_counter() - t)
    return ({k: 1e3 * statistics.median(v) for k, v in times.items()}, {k: 1e3 * min(v) for k, v in times.items()})

def alternate_by_phase(arms: dict, rounds: int, probe, nbytes: int, slow_gbs: float = 40.0, fast_gbs: float = 45.0) -> dict:
    """`alternate`'s rounds, each begun by `probe` (a read of `nbytes`, timed): the memory's rate in that round. On a VM whose memory
    switches between two levels every few seconds, a round is in the slow phase below `slow_gbs` and in the fast one above
    `fast_gbs`. Returns {phase: (rounds, {arm: median ms})} for 'slow', 'fast' and 'all', a phase without rounds left out."""
    for f in arms.values(): f()
    probe(); seen = []
    for r in range(rounds):
        t = time.perf_counter(); probe(); gbs = nbytes / (time.perf_counter() - t) / 1e9
        times = {}
        for name, f in (arms.items() if r % 2 == 0 else list(arms.items())[::-1]):
            t = time.perf_counter(); f(); times[name] = time.perf_counter() - t
        seen.append((gbs, times))
    out = {}
    for phase, keep in (('slow', lambda g: g < slow_gbs), ('fast', lambda g: g > fast_gbs), ('all', lambda g: True)):
        rs = [t for g, t in seen if keep(g)]
        if rs: out[phase] = (len(rs), {k: 1e3 * statistics.median(t[k] for t in rs) for k in arms})
    return out

def append_results(out: str, name: str, rows: list[dict], header: str, lines: list[str]):
    "Append `rows` to OUT/NAME.csv (a header if the file is new) and `header` and `lines` to OUT/NAME.txt."
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    f = out/f'{name}.csv'; new = not f.exists()
    with open(f, 'a', newline='') as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        if new: w.writeheader()
        w.writerows(rows)
    with open(out/f'{name}.txt', 'a') as fh: fh.write(header + '\n' + '\n'.join(lines) + '\n\n')

def write_results(out: str, name: str, rows: list[dict], lines: list[str]):
    """Write `rows` to OUT/NAME.csv and `lines`, then the command that ran (`python bench/<script> <its arguments>`), to OUT/NAME.txt,
    replacing what was there; print the lines."""
    import sys
    from nanoserve.offline_bench import write_csv
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out/f'{name}.csv')
    lines = [*lines, f"command: python bench/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}".rstrip()]
    (out/f'{name}.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))
