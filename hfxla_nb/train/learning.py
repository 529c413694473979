"""Signs that a fine-tune learned nothing (accuracy at chance, a loss that barely fell), each
with its likely causes: plain logic the worker runs (`loop.py`) and the result carries.

Below both `loop.py` and `result.py`, so that neither imports the other.
"""

from __future__ import annotations

# Evaluation accuracy within this of always predicting the most frequent label is "at chance".
CHANCE_MARGIN = 0.02
# A training loss that fell by less than this share from its first logged value learned little.
MIN_LOSS_DROP = 0.05


def learning_warnings(loss_history: list, metrics: dict[str, float],
                      chance: float | None) -> list[str]:
    """Signs that a fine-tune learned nothing, each with its likely causes.

    Args:
        loss_history: `(step, loss)` pairs as logged.
        metrics: the evaluation metrics (`eval_accuracy` is read).
        chance: the accuracy of always predicting the most frequent label.
    """
    signs = []
    accuracy = metrics.get("eval_accuracy")
    if accuracy is not None and chance is not None and accuracy <= chance + CHANCE_MARGIN:
        signs.append(f"the evaluation accuracy {accuracy:.3f} is at chance level ({chance:.3f} "
                     "by always predicting the most frequent label)")
    if len(loss_history) >= 2:
        first, last = float(loss_history[0][1]), float(loss_history[-1][1])
        if first > 0 and (first - last) / first < MIN_LOSS_DROP:
            signs.append(f"the training loss fell only {max(first - last, 0) / first:.0%} "
                         f"({first:.3f} -> {last:.3f})")
    if not signs:
        return []
    return ["The model learned little: " + " and ".join(signs) + ". Likely causes: a learning "
            "rate too low (or so high that the loss cannot fall), too few epochs or steps, or "
            "labels that do not match the texts (a wrong label_column, shuffled labels)."]
