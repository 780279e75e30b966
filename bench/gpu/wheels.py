"""The wheels a lent GPU machine needs to run nanoserve, derived rather than listed by hand (a hand list fell
behind once, and every command died at import there).

The closure: nanoserve's install requirements (settings.ini) and the client the GPU run drives (openai), followed
through the metadata of the packages installed in this checkout's .venv, with markers evaluated for the machine
(CPython 3.12 on x86-64 Linux). From it, carry:
- every package the machine lacks (bench/gpu/machine_packages.txt, from the device entry's KINDS.md);
- every pure-Python package, even one the machine has: a newer copy shadows the machine's safely, and ours may be
  needed (the first run lacked a newer idna and typing_extensions, which the machine has at older versions);
and never a compiled package the machine has (torch, numpy, tokenizers, ...): its copy is built against the
machine's CUDA and Python, and ours would shadow it. What such a package requires is its own business there, so the
closure does not follow it (else our huggingface-hub would shadow the one the machine's transformers needs).

Run with this checkout's .venv: `python bench/gpu/wheels.py` prints one `name==version` a line; `--why` says why each.
"""
import argparse, configparser, sys
from importlib import metadata
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ['openai']          # what the GPU run drives nanoserve with, beyond its own requirements
MACHINE = {'python_version': '3.12', 'python_full_version': '3.12.3', 'sys_platform': 'linux',
           'platform_system': 'Linux', 'platform_machine': 'x86_64', 'os_name': 'posix',
           'implementation_name': 'cpython',
           'platform_python_implementation': 'CPython', 'extra': ''}

def roots() -> list[Requirement]:
    "nanoserve's install requirements and the clients, as requirements."
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT / 'settings.ini', encoding='utf-8')
    return [Requirement(r) for r in cfg['DEFAULT']['requirements'].split() + CLIENTS]

def machine_packages(path: Path = Path(__file__).with_name('machine_packages.txt')) -> set[str]:
    "The packages the machine has, by canonical name."
    lines = (l.strip() for l in path.read_text().splitlines())
    return {canonicalize_name(l) for l in lines if l and not l.startswith('#')}

def is_pure(dist: metadata.Distribution) -> bool:
    "A wheel whose files are all Python (`Root-Is-Purelib: true`)."
    return 'root-is-purelib: true' in (dist.read_text('WHEEL') or '').lower()

def carries(name: str, dist: metadata.Distribution, there: set[str]) -> bool:
    "Whether `name` travels: missing there, or pure Python; never torch."
    return name != 'torch' and (name not in there or is_pure(dist))

def closure(reqs: list[Requirement], there: set[str]) -> dict[str, tuple[metadata.Distribution, str]]:
    """name -> (its installed distribution, who asked for it first), following every requirement whose marker holds
    there, through the packages that travel only."""
    found, todo = {}, [(r, 'nanoserve') for r in reqs]
    while todo:
        req, parent = todo.pop()
        if req.marker is not None and not req.marker.evaluate(MACHINE): continue
        name = canonicalize_name(req.name)
        if name in found: continue
        try: dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{req.name} (asked for by {parent}) is not installed in this .venv: "
                             "run make install-test first")
        found[name] = (dist, parent)
        if not carries(name, dist, there): continue
        for r in dist.requires or []:
            rr = Requirement(r)
            if rr.marker is None or rr.marker.evaluate(MACHINE): todo.append((Requirement(str(rr).split(';')[0]), name))
    return found

def carried(found: dict, there: set[str]) -> list[tuple[str, str, str]]:
    "(name, version, why) of each package to carry, sorted by name."
    out = []
    for name, (dist, parent) in sorted(found.items()):
        if not carries(name, dist, there): continue
        if name not in there: out.append((name, dist.version, f'missing there (for {parent})'))
        elif is_pure(dist): out.append((name, dist.version, f'pure Python, shadows the machine\'s (for {parent})'))
    return out

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--why', action='store_true', help='say why each package is carried')
    args = p.parse_args(argv)
    there = machine_packages()
    for name, version, why in carried(closure(roots(), there), there):
        print(f'{name}=={version}' + (f'  # {why}' if args.why else ''))
    return 0

if __name__ == '__main__': sys.exit(main())
