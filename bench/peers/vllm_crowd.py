#!/usr/bin/env python
"""vLLM's CPU build generating for a crowd offline, the workload of `bench/moe.py crowd`; run with vLLM's own venv's
python.

    /work/peers/vllm/bin/python bench/peers/vllm_crowd.py MODEL_DIR --requests 32 --tokens 64 --rounds 2

`LLM(MODEL_DIR)` in bfloat16, then --rounds times the same --requests prompts (32 token ids each, drawn as
bench/moe.py draws them: torch.Generator seeded 0, ids in [100, 40000)), greedy, ignore_eos, --tokens new tokens each;
prints one JSON line with each round's seconds and output tokens a second (its exit code is not read: vLLM 0.32's CPU
build ends its shutdown in a C++ terminate here)."""
import argparse, json, os, time
os.environ.setdefault('VLLM_CPU_KVCACHE_SPACE', '2')
os.environ.setdefault('VLLM_NO_USAGE_STATS', '1')
os.environ.setdefault('HF_HUB_OFFLINE', '1')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('model')
    ap.add_argument('--requests', type=int, default=32)
    ap.add_argument('--tokens', type=int, default=64)
    ap.add_argument('--rounds', type=int, default=2)
    args = ap.parse_args()
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    g = torch.Generator().manual_seed(0)
    prompts = [TokensPrompt(prompt_token_ids=torch.randint(100, 40000, (32,), generator=g).tolist())
               for _ in range(args.requests)]
    llm = LLM(model=args.model, dtype='bfloat16', max_model_len=512, max_num_seqs=args.requests)
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), use_tqdm=False)
    rounds = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        n = sum(len(o.outputs[0].token_ids) for o in outs)
        rounds.append({'seconds': round(seconds, 2), 'output_tok_s': round(n / seconds, 2)})
    import vllm
    print(json.dumps({'engine': f'vLLM {vllm.__version__}', 'rounds': rounds}), flush=True)


if __name__ == '__main__': main()
