"""The Visual Reflection Dataset on generated scenes (§2.3 of the notes): 8 captions per training scene from the
policy at temperatures 0.0 to 1.4, each scored by the critic, assembled into dialogues (``dialogues.assemble``).
``candidates: corrupt`` replaces the policy's captions by the true caption with k elements dropped, changed or
invented (the notes' small-scale design), for a model whose own captions spread too little."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from llmx.core.multimodal import languages as L
from llmx.core.multimodal.answer import reply
from llmx.core.multimodal.model import IMAGE_TOKEN
from llmx.core.multimodal.scenes import Scene
from llmx.plugins.reper.critic import RuleCritic
from llmx.plugins.reper.dialogues import Dialogue, assemble

QUESTION = f"{IMAGE_TOKEN}\n{L.question('en', 'caption')}"


def corrupt(scene: Scene, k: int, rng: random.Random) -> str:
    """The scene's English caption after ``k`` edits, each dropping an object, changing one of its attributes (a
    place to a free cell) or inventing an object of an absent digit in a free cell; relations are kept between the
    objects that remain."""
    objs = [o.key() for o in scene.objects]
    for _ in range(k):
        edits = [e for e, ok in (("drop", len(objs) > 1), ("change", True), ("invent", len(objs) < len(L.CELLS))) if ok]
        edit = rng.choice(edits)
        free = [c for c in L.CELLS if c not in {o[3] for o in objs}]
        if edit == "drop":
            objs.pop(rng.randrange(len(objs)))
        elif edit == "change":
            i, slot = rng.randrange(len(objs)), rng.randrange(1, 4 if free else 3)
            values = (L.COLOURS, L.SIZES, free)[slot - 1]
            o = list(objs[i])
            o[slot] = rng.choice([v for v in values if v != o[slot]])
            objs[i] = tuple(o)
        else:
            absent = [d for d in range(10) if d not in {o[0] for o in objs}]
            objs.append((rng.choice(absent), rng.choice(L.COLOURS), rng.choice(L.SIZES), rng.choice(free)))
    kept = {o[0] for o in objs}
    relations = [r for r in scene.relations if r[0] in kept and r[2] in kept]
    return L.caption("en", objs, relations)


def candidates(model, proc, scenes: list[Scene], temperatures: list[float], source: str, max_new_tokens: int,
               batch_size: int, seed: int, progress) -> list[list[str]]:
    """Per scene, one caption per temperature (or corruption level)."""
    if source == "corrupt":
        rng = random.Random(f"reper-corrupt:{seed}")
        return [[corrupt(s, k, rng) for k in range(len(temperatures))] for s in scenes]
    per_t = [reply(model, proc, [[{"role": "user", "content": QUESTION}]] * len(scenes), scenes, max_new_tokens,
                   temperature=t, seed=seed + k, batch_size=batch_size, progress=progress)
             for k, t in enumerate(temperatures)]
    return [[per_t[k][i] for k in range(len(temperatures))] for i in range(len(scenes))]


def dialogues(scenes: list[Scene], captions: list[list[str]], critic: RuleCritic, score_gap: float, min_score: float,
              max_turns: int, turn_weights: list[float] | None, seed: int) -> tuple[list[Dialogue], dict[str, Any]]:
    """Score every caption and assemble the dialogues; the statistics of what was kept."""
    rng = random.Random(f"reper-turns:{seed}")
    asked = QUESTION.replace(IMAGE_TOKEN, "").strip()
    out, histogram, gaps = [], Counter(), []
    for i, (scene, caps) in enumerate(zip(scenes, captions, strict=True)):
        scored = [(c, *critic.score(scene, asked, c)) for c in caps]
        histogram.update(s for _, s, _ in scored)
        gaps.append(max(s for _, s, _ in scored) - min(s for _, s, _ in scored))
        turns = assemble(scored, rng, score_gap, min_score, max_turns, turn_weights)
        if turns is None:
            continue
        out.append(Dialogue(f"scene {i}", scene, QUESTION, [a for a, _, _ in turns], [f for _, _, f in turns[:-1]],
                            list(range(1, len(turns) + 1)), [s for _, s, _ in turns], [None] * len(turns)))
    per_turns = Counter(len(d.answers) for d in out)
    stats = {"scenes": len(scenes), "dialogues": len(out), "kept_share": len(out) / len(scenes),
             **{f"dialogues_{t}_turns": per_turns.get(t, 0) for t in range(1, max_turns + 1)},
             "score_histogram": {str(s): histogram.get(s, 0) for s in range(1, 11)},
             "mean_candidate_score": sum(s * c for s, c in histogram.items()) / max(sum(histogram.values()), 1),
             "mean_score_gap": sum(gaps) / len(gaps)}
    return out, stats


def image_name(k: int) -> str:
    return f"images/{k:05d}.png"


