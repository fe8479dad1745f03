"""Data that the benchmark and training share: the code corpus (`corpus`), prompt sets (`prompts`:
the benchmark's; `distill_prompts`: the ones heads are self-distilled on) and chat rendering
(`chat`: a prompt row as messages, text or token ids)."""
