#!/usr/bin/env python
"""llama.cpp as a peer, run with the Python of the venv bench/peers/install_llamacpp.sh made (never nanoserve's).

    PY=/work/peers/llamacpp/bin/python
    $PY bench/peers/llamacpp_peer.py f16 SRC.gguf DST.gguf          # the same weights as F16 (norms stay F32), metadata copied
    $PY bench/peers/llamacpp_peer.py decode MODEL.gguf --threads 2   # batch-1 greedy decode tokens/s, one JSON line

`f16` dequantizes every quantized tensor of SRC with the gguf package and writes it as F16: from the default model's Q4_1 GGUF this
gives llama.cpp the very weights nanoserve serves (its checkpoint is that GGUF, dequantized by `nanoserve pull`)."""
import argparse, json, sys, time

def make_f16(src: str, dst: str):
    import numpy as np
    from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType, GGUFValueType
    from gguf.quants import dequantize
    r = GGUFReader(src)
    arch = r.fields['general.architecture'].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith('GGUF.') or name == 'general.architecture': continue
        vtype = f.types[0]
        if name == 'general.file_type': w.add_uint32(name, 1); continue          # MOSTLY_F16
        if vtype == GGUFValueType.ARRAY: w.add_key_value(name, f.contents(), vtype, sub_type=f.types[-1])
        else: w.add_key_value(name, f.contents(), vtype)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))               # gguf lists dimensions innermost first
        x = dequantize(t.data, t.tensor_type).reshape(shape)
        w.add_tensor(t.name, x.astype(np.float32 if len(shape) == 1 else np.float16))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

def decode(model: str, threads: int, prompt_len: int, output_len: int, runs: int) -> dict:
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=512, n_threads=threads, n_batch=64, logits_all=True, verbose=False)   # scores of every position: the last one is read
    rates = []
    for run in range(runs):
        llm.reset()
        prompt = [1] + [100 + (7 * i + run) % 5000 for i in range(prompt_len - 1)]
        llm.eval(prompt)
        t0, n = time.perf_counter(), 0
        for _ in range(output_len):                                              # greedy, one token at a time, EOS ignored
            tok = int(llm.scores[llm.n_tokens - 1].argmax())
            llm.eval([tok]); n += 1
        rates.append(n / (time.perf_counter() - t0))
    import llama_cpp
    return {'engine': f'llama.cpp (llama-cpp-python {llama_cpp.__version__})', 'batch1_tok_s': sorted(rates)[len(rates) // 2], 'runs': runs}

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    f = sub.add_parser('f16'); f.add_argument('src'); f.add_argument('dst')
    d = sub.add_parser('decode'); d.add_argument('model'); d.add_argument('--threads', type=int, default=2)
    d.add_argument('--prompt-len', type=int, default=32); d.add_argument('--output-len', type=int, default=64); d.add_argument('--runs', type=int, default=3)
    a = p.parse_args()
    if a.cmd == 'f16': make_f16(a.src, a.dst)
    else: print(json.dumps(decode(a.model, a.threads, a.prompt_len, a.output_len, a.runs)))
