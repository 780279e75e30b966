"""The seams hold: no module reaches into another object's private names, except the third-party ones listed here with the reason, and no
method is attached by assignment (`X.y = _y`) rather than defined in its class or with fastcore's @patch."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each private name we use and why no public one serves. Our own objects' private names are never read from outside them.
ALLOWED = {
    'torch._dynamo.config': "capture.recompile_limits: dynamo's recompile limits have no public setter; patched around our own calls only",
    'torch.fx.experimental._config': "capture.size_oblivious: size-oblivious tracing is only a config flag; patched around our own calls only",
    'torch.ops.mkldnn._reorder_linear_weight': "fast.FastLinear.pack: oneDNN's prepacked weight layout has no public op in torch's CPU build",
    'torch.ops.mkldnn._linear_pointwise': "fast.FastLinear.forward: the GEMM that reads a prepacked weight (the same op torch.compile's CPU backend emits)",
    'torch._weight_int8pack_mm': "quant.Int8Linear: PyTorch's weight-only int8 CPU kernel has no public name (torchao and gpt-fast call the same op)",
    'torch._weight_int4pack_mm_for_cpu': "quant.Int4Linear: PyTorch's weight-only int4 CPU kernel, the one torchao's int4 CPU layout calls",
    'torch._convert_weight_to_int4pack_for_cpu': "quant.Int4Linear: packs int4 codes into that kernel's layout; no public op does",
    'mod._parameters': "weights.set_parameter: swap a parameter of a meta-device module without a copy (what nn.Module.register_parameter does, minus its checks)",
    'dist.ProcessGroupGloo._Options': "parallel._gloo: a gloo group connecting from a chosen address; its constructor "
                                      "takes a device only inside this options object (init_process_group builds one)",
    'opts._devices': "parallel._gloo: the device (the address that routes to MASTER_ADDR) a gloo group connects from; "
                     "the options object has no public field for it",
    'opts._timeout': "parallel._gloo: the group's own timeout beside its device (init_process_group sets it too)",
    'os._exit': "parallel.worker_main: a worker leaves without the interpreter's shutdown, which aborts around gloo's threads (the stdlib's documented exit for child processes)",
}
PRIVATE = re.compile(r'\b((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\._([A-Za-z]\w*(?:\.[A-Za-z_]\w*)*)')
ASSIGNED = re.compile(r'^\s*[A-Za-z_]\w*\.[A-Za-z_]\w*\s*=\s*_[A-Za-z]\w*\s*(#.*)?$')

def sources():
    for p in sorted([*(ROOT/'nanoserve').glob('*.py'), *(ROOT/'tests').glob('*.py')]):
        if p.name not in ('_modidx.py', 'test_seams.py'): yield p, p.read_text()

def private_uses(text: str) -> set[str]:
    code = '\n'.join(l.split('#')[0] for l in text.splitlines())      # comments may name anything
    return {f"{obj}._{name}" for obj, name in PRIVATE.findall(code) if obj not in ('self', 'cls')}

def test_private_names_only_the_documented_ones():
    found = {(p.relative_to(ROOT).as_posix(), use) for p, text in sources() for use in private_uses(text)}
    assert {f for f in found if f[1] not in ALLOWED} == set()
    assert {use for _, use in found} == set(ALLOWED), 'an allowed name is no longer used: drop it from ALLOWED'

def test_no_method_assignments():
    assert [(p.name, l.strip()) for p, text in sources() if p.parent.name == 'nanoserve' for l in text.splitlines() if ASSIGNED.match(l)] == []

def test_the_checks_see_what_they_guard():
    "The patterns find the shapes they forbid (so the two tests above cannot pass by matching nothing)."
    assert private_uses('x = aeng._inbox  # a._b in a comment') == {'aeng._inbox'}
    assert private_uses('self._x = cls._y') == set()
    assert ASSIGNED.match('Engine.step = _step') and not ASSIGNED.match('self.x = _y(1)')
