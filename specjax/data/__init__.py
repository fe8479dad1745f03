"""Data that the benchmark and training share: the code corpus (`corpus`), prompt sets (`prompts`:
the benchmark's; `distill_prompts`: the ones heads are self-distilled on, made from
`stdlib_text`'s functions and passages and `word_problems`) and chat rendering (`chat`: a prompt
row as messages, text or token ids)."""
