"""A hole in a server's rows on cue (tests/test_graphbench.py, tests/test_batch.py): the order of admission is the
test's, not the order a crowd's requests happen to reach the server.

A short request is sent to an idle server and admitted alone, into row 0; a long one is sent once the short one has
streamed its first token, and admitted while the short one still runs, into row 1. The short one ends first, and the
long one decodes on alone in row 1: without the persistent batch, every one of those steps has a hole below it. Whether
the two ran together is read from the server's own count of requests a step (/health's `steps_by_batch`), and the pair
is sent again until they did (a machine too loaded to admit the long one before the short one ends)."""
import json, threading
import httpx
from nanoserve.graphbench import wait_idle

SHORT, LONG = 96, 160         # tokens each decodes (ignore_eos); a prompt of 4 fits a 256-token context

def complete(url: str, model: str, prompt: list[int], max_tokens: int, first: threading.Event | None = None) -> str:
    """One streamed completion's text, sampled with a seed (a tiny random model's greedy text repeats one token whatever
    its context; a sample follows the logits); `first` set when its first token arrives."""
    body = {'model': model, 'prompt': prompt, 'max_tokens': max_tokens, 'temperature': 1.0, 'seed': sum(prompt),
            'ignore_eos': True, 'stream': True}
    parts = []
    with httpx.stream('POST', url + '/v1/completions', json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith('data: ') or line == 'data: [DONE]': continue
            parts.append(json.loads(line[6:])['choices'][0]['text'])
            if first is not None: first.set()
    return ''.join(parts)

def pair_ran_together(before: dict, after: dict) -> bool:
    "The server counted a step with two requests between the two /health readings."
    count = lambda h: int(h['stats']['steps_by_batch'].get('2', 0))
    return count(after) > count(before)

def hole(url: str, model: str, tries: int = 5) -> tuple[list[str], dict, dict]:
    """The pair's texts (short, long) and /health before and after it, once the server ran them together."""
    for _ in range(tries):
        before = wait_idle(url)
        started, texts = threading.Event(), {}
        short = threading.Thread(target=lambda: texts.__setitem__('short', complete(url, model, [5, 9, 17, 23], SHORT,
                                                                                    started)))
        short.start()
        if not started.wait(120): raise TimeoutError('the short request streamed nothing in 120 s')
        texts['long'] = complete(url, model, [3, 4, 5, 6], LONG)
        short.join()
        after = wait_idle(url)
        if pair_ran_together(before, after): return [texts['short'], texts['long']], before, after
    raise AssertionError(f'the server never ran the pair together in {tries} tries')

def runtime(h: dict) -> dict: return h['cuda_graphs']['runtime']

def scattered(before: dict, after: dict) -> int:
    "Decode steps the server ran the forward for because their rows were not a prefix, between the two readings."
    return runtime(after)['scattered_calls'] - runtime(before)['scattered_calls']
