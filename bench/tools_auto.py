#!/usr/bin/env python
"""Does the model call tools when it may (`tool_choice: auto`)? Ten questions a weather/time tool answers, greedy and at temperature 0.7.

    python bench/tools_auto.py                    # the default model
    python bench/tools_auto.py --model DIR

Runs `nanoserve serve` on loopback and asks through the openai client; prints each answer and how many came back as tool
calls, and writes OUT/tools_auto.txt. Not part of CI: it measures a model's habits, not nanoserve's correctness.
"""
import argparse, sys
from pathlib import Path
import openai
from nanoserve.loadgen import spawn_server
from nanoserve.pull import resolve_model
from nanoserve.offline_bench import machine

TOOLS = [{'type': 'function', 'function': {'name': 'get_weather', 'description': 'Current weather in a city', 'parameters': {
             'type': 'object', 'properties': {'city': {'type': 'string'}, 'unit': {'enum': ['celsius', 'fahrenheit']}}, 'required': ['city', 'unit']}}},
         {'type': 'function', 'function': {'name': 'get_time', 'description': 'Current time in a timezone', 'parameters': {
             'type': 'object', 'properties': {'timezone': {'type': 'string'}}, 'required': ['timezone']}}}]
ASKS = ['What is the weather like in Paris today?', 'What time is it in Tokyo?', 'Is it raining in London?',
        'Tell me the temperature in Berlin in celsius.', 'What is the current time in New York?', 'Should I take an umbrella in Oslo today?',
        'Weather in Rome please.', 'get_weather for Madrid', 'Call the get_time function for UTC.', 'How hot is it in Cairo right now?']

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default=None); p.add_argument('--out', default='bench/results')
    args = p.parse_args()
    path = resolve_model(args.model, log=lambda m: print(m, file=sys.stderr))
    lines, calls = [], 0
    with spawn_server(path, '--served-model-name', 'm') as (url, _):
        client = openai.OpenAI(base_url=url + '/v1', api_key='none')
        for temp in (0.0, 0.7):
            for i, ask in enumerate(ASKS):
                m = client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': ask}], tools=TOOLS, max_tokens=80,
                                                   temperature=temp, seed=i).choices[0].message
                calls += bool(m.tool_calls)
                said = ', '.join(f'{c.function.name}({c.function.arguments})' for c in m.tool_calls) if m.tool_calls else repr((m.content or '')[:70])
                lines.append(f"t={temp} {'CALL' if m.tool_calls else 'text'}  {ask!r}: {said}")
    lines.insert(0, f"machine: {machine().rsplit(',', 1)[0]}; server in its default dtype and threads")
    lines.append(f"{Path(path).name}: {calls} of {2 * len(ASKS)} answers were tool calls (tool_choice auto, tools in the prompt)")
    lines.append(f"command: python bench/tools_auto.py {' '.join(sys.argv[1:])}".rstrip())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out)/'tools_auto.txt').write_text('\n'.join(lines) + '\n'); print('\n'.join(lines))

if __name__ == '__main__': main()
