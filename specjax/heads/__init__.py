"""Draft heads that read the target's hidden states: Medusa (parallel ResBlock heads), Clover
(sequentially dependent heads after an augmenting block) and EAGLE (a one-layer feature-level
autoregressive draft, versions 1 and 3), the trained guesses of PPD and Hidden Transfer, and the
reduced draft vocabulary Medusa and Clover may draft over (`vocab`). Pure init/apply functions
over params dicts, each head's params declared in its `PARAMS` (`specjax.models.params`); the
drafters that use them live in `specjax.drafters`, their checkpoint formats in
`specjax.convert.heads`."""

from specjax.heads import clover, eagle, hidden_transfer, medusa, ppd, vocab

DECLARED = (clover.PARAMS, eagle.PARAMS, hidden_transfer.PARAMS, medusa.PARAMS, ppd.PARAMS)

__all__ = ["DECLARED", "clover", "eagle", "hidden_transfer", "medusa", "ppd", "vocab"]
