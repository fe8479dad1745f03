"""Building blocks that several drafters share, not methods themselves: a head's KV cache over
the target's features (`feature_cache`: EAGLE, Clover), a suffix automaton over token ids
(`suffix_automaton`: SAM) and chain drafting with the target's own layers, some skipped
(`self_draft`: Swift, DEL)."""
