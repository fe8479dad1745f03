"""Draft heads that read the target's hidden states: Medusa (parallel ResBlock heads) and EAGLE
(a one-layer feature-level autoregressive draft, versions 1 and 3). Pure init/apply functions
over params dicts; the drafters that use them live in `specjax.drafters.heads`."""

from specjax.heads import eagle, medusa

__all__ = ["eagle", "medusa"]
