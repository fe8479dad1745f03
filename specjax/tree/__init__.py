"""The draft tree: its type and the Verdict a verifier returns (`draft_tree`), static templates
(`template`), Medusa's sparse trees (`sparse`), pruning to a node budget (`budget`), dynamic
growth, DySpec's and EAGLE-2's (`growth`), and the per-row gather every tree reader uses
(`gather`)."""

from specjax.tree.draft_tree import DraftTree, Verdict, chain
from specjax.tree.gather import row_gather
from specjax.tree.template import Template

__all__ = ["DraftTree", "Verdict", "chain", "row_gather", "Template"]
