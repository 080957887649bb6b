"""What a merge's survival check is measured on: an evaluation set, as the engine's own
score items.

An item with an answer is a `messages.ScoreItem`, tokenized for the check exactly as
`runtime.scoring` tokenizes it for a score (it is the same function). A set with no
answers is a list of probe prompts, served as a request is (the variant's system prompt
included); on each, the variant's own greedy continuation is the teacher-forced text and
no task accuracy is measured.

Which set a variant gets is chosen in `training.merge_eval` (it reads score sets and
the demo's held-out file, which sit above this room).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.runtime.messages import Prompt, ScoreItem

PROBE_PROMPTS = (
    "What will the weather be in Lisbon tomorrow?",
    "Write a short poem about the sea.",
    "Explain in two sentences what a LoRA adapter is.",
    "Set a timer for ten minutes.",
    "Translate 'good morning' into French.",
    "List three uses of a paperclip.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "What is 17 times 23?",
)


def answered(item: ScoreItem) -> bool:
    """Is `item` an answer after a prompt (a chat or pair item), so that a greedy answer
    can be matched against it?"""
    return item.kind in ("chat", "pair")


@dataclass(frozen=True)
class EvalSet:
    """What survival is measured on: `kind` "eval" (an adapter's evaluation set, as
    `eval attach` keeps it), "heldout" (the demo's held-out file) or "probe" (fixed chat
    prompts, no answers, in `probes`)."""

    name: str
    kind: str
    items: tuple[ScoreItem, ...] = ()
    probes: tuple[Prompt, ...] = ()

    @property
    def size(self) -> int:
        return len(self.items) + len(self.probes)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "items": self.size,
                "answers": sum(answered(item) for item in self.items)}

    def first(self, limit: int) -> EvalSet:
        """The set's first `limit` items (itself when it has no more)."""
        if limit >= self.size:
            return self
        return EvalSet(f"{self.name}, first {limit}", self.kind, self.items[:limit],
                       self.probes[:max(0, limit - len(self.items))])


def probe_set(system: str | None) -> EvalSet:
    """The fixed chat prompts, with the variant's system prompt (None: the spec's)."""
    return EvalSet("fixed chat prompts (no answers)", "probe",
                   probes=tuple(Prompt(text, chat=True, system=system)
                                for text in PROBE_PROMPTS))
