"""User reward functions for the trainer tests, named "trainer_reward_fns:NAME" in configs.

Kept free of imports: a reward worker imports this module inside its timed call.
"""

import time


def flaky_reward(prompt, response, answer, metadata):
    """Raises or hangs on the prompts marked so; otherwise 1.0 when the verdict is 'yes'."""
    if metadata.get("fail") == "raise":
        raise RuntimeError("boom on a marked prompt")
    if metadata.get("fail") == "sleep":
        time.sleep(30)
    return says_yes(prompt, response, answer, metadata)


def says_yes(prompt, response, answer, metadata):
    """1.0 when the verdict is 'yes' in either language: mixed within most groups of a sampled model."""
    return float(response.startswith(("是", "Yes")))
