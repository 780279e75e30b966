#!/usr/bin/env python
"""llama.cpp as a peer, run with the Python of the venv bench/peers/install_llamacpp.sh made (never nanoserve's).

    PY=/work/peers/llamacpp/bin/python
    $PY bench/peers/llamacpp_peer.py f16 SRC.gguf DST.gguf          # the same weights as F16 (norms stay F32), metadata copied
    $PY bench/peers/llamacpp_peer.py decode MODEL.gguf --threads 2   # batch-1 greedy decode tokens/s, one JSON line
    $PY bench/peers/llamacpp_peer.py lookup MODEL.gguf PROMPTS.json  # greedy completions, plain and with lookup decoding

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

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    f = sub.add_parser('f16'); f.add_argument('src'); f.add_argument('dst')
    d = sub.add_parser('decode'); d.add_argument('model'); d.add_argument('--threads', type=int, default=2)
    d.add_argument('--prompt-len', type=int, default=32); d.add_argument('--output-len', type=int, default=64); d.add_argument('--runs', type=int, default=3)
    k = sub.add_parser('lookup')
    k.add_argument('model')
    k.add_argument('prompts')
    k.add_argument('--threads', type=int, default=2)
    k.add_argument('--max-tokens', type=int, default=256)
    k.add_argument('--num-pred-tokens', type=int, default=8)
    k.add_argument('--max-ngram-size', type=int, default=4)
    a = p.parse_args()
    if a.cmd == 'f16': make_f16(a.src, a.dst)
    elif a.cmd == 'lookup':
        print(json.dumps(lookup(a.model, a.prompts, a.threads, a.max_tokens, a.num_pred_tokens, a.max_ngram_size)))
    else: print(json.dumps(decode(a.model, a.threads, a.prompt_len, a.output_len, a.runs)))
