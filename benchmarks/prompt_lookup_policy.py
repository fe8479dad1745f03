"""Which n-gram matches are worth a verify pass: prompt lookup replayed on SmolLM2's greedy
answers (8 HumanEval + 12 chat prompts, 96 tokens), with each step's cost from the forward-cost
curve (a verify over N nodes costs COST[N] AR steps; measured at N = 1, 4, 8, 16 on a quiet
machine, interpolated between). Greedy output does not depend on the drafter, so the replay
gives each policy's exact accepted counts; only the costs are modelled.
python benchmarks/prompt_lookup_policy.py"""
import numpy as np

import specjax as sj
from specjax.data.chat import chat_messages
from specjax.data.prompts import prompt_set

COST = dict(zip(range(1, 17), np.interp(range(1, 17), [1, 4, 8, 16], [1.0, 1.4, 1.7, 2.4])))


def draft(seq, length, max_ngram, min_ngram, k):
    """PromptLookup's chain: the continuation of the earliest earlier match of the longest n-gram."""
    for n in range(max_ngram, min_ngram - 1, -1):
        last = seq[length - n: length]
        for i in range(length - n):
            if length > n and seq[i: i + n] == last:
                return seq[i + n: min(i + n + k, length)]
    return []


def replay(answers, max_ngram, min_ngram, k):
    tokens = cost = steps = 0
    for prompt, answer in answers:
        seq, length = prompt + answer, len(prompt)
        while length < len(seq):
            d = draft(seq, length, max_ngram, min_ngram, k)
            accepted = next((j for j, t in enumerate(d) if length + j >= len(seq) or t != seq[length + j]), len(d))
            tokens, cost, steps, length = tokens + accepted + 1, cost + COST[len(d) + 1], steps + 1, length + accepted + 1
    return tokens / steps, tokens / cost


model, tok = sj.load("smollm2"), sj.load_tokenizer("smollm2")
prompts = [tok.chat(chat_messages(r)) for r in prompt_set("humaneval", 8) + prompt_set("chat", 12)]
out = sj.generate(model, prompts, max_new_tokens=96)
answers = [(p, o[:n].tolist()) for p, o, n in zip(prompts, out.tokens, out.num_tokens)]
print("| max_ngram | min_ngram | tokens drafted | tau | modelled speedup |\n|---|---|---|---|---|")
for max_ngram, min_ngram, k in [(3, 1, 6), (3, 2, 6), (3, 3, 6), (3, 1, 3), (3, 2, 3), (3, 2, 10), (4, 2, 6)]:
    tau, speedup = replay(answers, max_ngram, min_ngram, k)
    print(f"| {max_ngram} | {min_ngram} | {k} | {tau:.2f} | {speedup:.2f}x |")
