#!/usr/bin/env python
"""llama.cpp as a peer, run with the Python of the venv bench/peers/install_llamacpp.sh made (never nanoserve's).

    PY=/work/peers/llamacpp/bin/python
    $PY bench/peers/llamacpp_peer.py f16 SRC.gguf DST.gguf          # the same weights as F16 (norms stay F32), metadata copied
    $PY bench/peers/llamacpp_peer.py decode MODEL.gguf --threads 2   # batch-1 greedy decode tokens/s, one JSON line
    $PY bench/peers/llamacpp_peer.py lookup MODEL.gguf PROMPTS.json  # greedy completions, plain and with lookup decoding
    $PY bench/peers/llamacpp_peer.py quantize F16.gguf DST.gguf Q8_0  # llama.cpp's own quantizer: Q8_0 or Q4_0
    $PY bench/peers/llamacpp_peer.py prefill MODEL.gguf --prompt-len 2000  # seconds to evaluate one prompt, one JSON line

`f16` dequantizes every quantized tensor of SRC with the gguf package and writes it as F16: from the default model's Q4_1 GGUF this
gives llama.cpp the very weights nanoserve serves (its checkpoint is that GGUF, dequantized by `nanoserve pull`)."""
import argparse, json, sys, time

def no_extra_buffer_types():
    """Load models with llama.cpp's extra buffer types off (its AMX and repacked layouts): on an Intel Sapphire Rapids VM
    (llama-cpp-python 0.3.36) evaluating a Q4_0, Q4_1 or Q8_0 model with them on ends in a segmentation fault; F16 runs
    either way. llama-cpp-python's Llama takes no argument for it, so its default model parameters are wrapped."""
    import llama_cpp.llama_cpp as C
    default = C.llama_model_default_params
    def params():
        p = default()
        p.use_extra_bufts = False
        return p
    C.llama_model_default_params = params

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

def lookup(model: str, prompts_json: str, threads: int, max_tokens: int, num_pred_tokens: int,
           max_ngram_size: int) -> dict:
    """Greedy completions of the prompts (token ids, one at a time, ending at EOS or max_tokens), by an engine without
    a draft and one with llama-cpp-python's prompt lookup decoding (LlamaPromptLookupDecoding, llama.cpp's n-gram
    lookup): each engine's output tokens over its seconds, and its completions' tokens."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    import llama_cpp
    prompts, out = json.load(open(prompts_json)), {'engine': f'llama.cpp (llama-cpp-python {llama_cpp.__version__})'}
    for arm in ('plain', 'lookup'):
        draft = LlamaPromptLookupDecoding(max_ngram_size, num_pred_tokens) if arm == 'lookup' else None
        llm = Llama(model_path=model, n_ctx=2048, n_threads=threads, n_batch=512, draft_model=draft, verbose=False)
        llm.create_completion(prompts[0], max_tokens=4, temperature=0.0)                # warm
        t0, n, texts = time.perf_counter(), 0, []
        for ids in prompts:
            r = llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, top_k=1)
            n += r['usage']['completion_tokens']
            texts.append(r['choices'][0]['text'])
        out[arm] = {'output_tokens': n, 'seconds': time.perf_counter() - t0, 'texts': texts}
        out[arm]['output_tok_s'] = n / out[arm]['seconds']
    return out
def quantize(src: str, dst: str, kind: str):
    "`src` (an F16 GGUF) quantized by llama.cpp's own quantizer to `kind` (Q8_0 or Q4_0), all threads."
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {'Q8_0': llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, 'Q4_0': llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}[kind]
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0: raise SystemExit(f"quantizing {src} to {kind} failed")

def prefill(model: str, threads: int, prompt_len: int, runs: int) -> dict:
    "Seconds to evaluate one prompt of `prompt_len` random tokens (batches of 512, the last position's logits): median of `runs`."
    from llama_cpp import Llama
    import llama_cpp
    llm = Llama(model_path=model, n_ctx=prompt_len + 64, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    secs = []
    for run in range(runs):
        llm.reset()
        prompt = [1] + [100 + (7 * i + 13 * run) % 40000 for i in range(prompt_len - 1)]
        t0 = time.perf_counter()
        llm.eval(prompt)
        secs.append(time.perf_counter() - t0)
    return {'engine': f'llama.cpp (llama-cpp-python {llama_cpp.__version__})', 'prefill_s': sorted(secs)[len(secs) // 2],
            'spread': f"{min(secs):.4g}-{max(secs):.4g}", 'runs': runs}

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    f = sub.add_parser('f16'); f.add_argument('src'); f.add_argument('dst')
    d = sub.add_parser('decode'); d.add_argument('model'); d.add_argument('--threads', type=int, default=2)
    d.add_argument('--prompt-len', type=int, default=32); d.add_argument('--output-len', type=int, default=64); d.add_argument('--runs', type=int, default=3)
    d.add_argument('--no-extra-bufts', action='store_true', help="llama.cpp's AMX and repacked layouts off (no_extra_buffer_types)")
    q = sub.add_parser('quantize'); q.add_argument('src'); q.add_argument('dst'); q.add_argument('kind', choices=['Q8_0', 'Q4_0'])
    r = sub.add_parser('prefill'); r.add_argument('model'); r.add_argument('--threads', type=int, default=2)
    r.add_argument('--prompt-len', type=int, default=2000); r.add_argument('--runs', type=int, default=3)
    r.add_argument('--no-extra-bufts', action='store_true', help="llama.cpp's AMX and repacked layouts off (no_extra_buffer_types)")
    k = sub.add_parser('lookup')
    k.add_argument('model')
    k.add_argument('prompts')
    k.add_argument('--threads', type=int, default=2)
    k.add_argument('--max-tokens', type=int, default=256)
    k.add_argument('--num-pred-tokens', type=int, default=8)
    k.add_argument('--max-ngram-size', type=int, default=4)
    a = p.parse_args()
    if getattr(a, 'no_extra_bufts', False): no_extra_buffer_types()
    if a.cmd == 'f16': make_f16(a.src, a.dst)
    elif a.cmd == 'quantize': quantize(a.src, a.dst, a.kind)
    elif a.cmd == 'prefill': print(json.dumps(prefill(a.model, a.threads, a.prompt_len, a.runs)))
    elif a.cmd == 'lookup':
        print(json.dumps(lookup(a.model, a.prompts, a.threads, a.max_tokens, a.num_pred_tokens, a.max_ngram_size)))
    else: print(json.dumps(decode(a.model, a.threads, a.prompt_len, a.output_len, a.runs)))
