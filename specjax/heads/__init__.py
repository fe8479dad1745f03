"""Draft heads that read the target's hidden states: Medusa (parallel ResBlock heads), Clover
(sequentially dependent heads after an augmenting block) and EAGLE (a one-layer feature-level
autoregressive draft, versions 1 and 3), and the reduced draft vocabulary Medusa and Clover
may draft over (`vocab`). Pure init/apply functions over params dicts; the
drafters that use them live in `specjax.drafters`."""

from specjax.heads import clover, eagle, medusa, vocab

__all__ = ["clover", "eagle", "medusa", "vocab"]
