"""A compact notation for lists of ranks, read and written the same way.

`0-7` is the ranks 0..7, `0-7680:512` every 512th rank from 0 to 7680, and items are separated by
commas: `0-7,512-519,9`. Megatron's groups are unions of arithmetic runs (mixed-radix
coordinates), so a group of thousands of ranks prints in a few items, and what the `topology`
command prints can be pasted back into a rank selection.
"""

from __future__ import annotations

from collections.abc import Sequence


def format_ranks(ranks: Sequence[int]) -> str:
    """Write `ranks` (kept in the given order) as comma-separated runs.

    A run of three or more ranks with a constant positive step becomes `first-last` (step 1) or
    `first-last:step`; anything else is written rank by rank. `parse_ranks` reads it back.
    """
    items: list[str] = []
    index = 0
    while index < len(ranks):
        end = index  # last index of the run that starts at `index`
        if index + 1 < len(ranks):
            step = ranks[index + 1] - ranks[index]
            end = index + 1
            while end + 1 < len(ranks) and ranks[end + 1] - ranks[end] == step:
                end += 1
            if step <= 0 or end - index < 2:
                end = index
        if end == index:
            items.append(str(ranks[index]))
        else:
            step = ranks[index + 1] - ranks[index]
            suffix = "" if step == 1 else f":{step}"
            items.append(f"{ranks[index]}-{ranks[end]}{suffix}")
        index = end + 1
    return ",".join(items)


def parse_ranks(text: str) -> list[int]:
    """Read comma-separated ranks and runs (`3`, `0-7`, `0-7680:512`) in the order written.

    Raises:
        ValueError: an item is not an integer or a run, or a run is empty or has a step below 1.
    """
    ranks: list[int] = []
    for raw_item in text.split(","):
        item = raw_item.strip()
        if not item:
            raise ValueError(f"empty item in rank list {text!r}")
        body, _, step_text = item.partition(":")
        first_text, dash, last_text = body.partition("-")
        try:
            first = int(first_text)
            last = int(last_text) if dash else first
            step = int(step_text) if step_text else 1
        except ValueError:
            raise ValueError(
                f"{item!r} in {text!r} is not a rank, a range FIRST-LAST or a stepped range FIRST-LAST:STEP"
            ) from None
        if step_text and not dash:
            raise ValueError(f"{item!r} in {text!r} has a step but no range; write FIRST-LAST:STEP")
        if step < 1 or last < first:
            raise ValueError(
                f"range {item!r} in {text!r} is empty; write FIRST-LAST:STEP with FIRST <= LAST, STEP >= 1"
            )
        ranks.extend(range(first, last + 1, step))
    return ranks
