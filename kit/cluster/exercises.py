"""Notebook 00's exercise, graded here so that no visible cell computes the answer (the notebook and its solutions
call the same check).

    check_square_sum(my_sum)            # exercise 1: the allreduced sum when every engine contributes (rank + 1)**2
"""
from __future__ import annotations


def check_square_sum(answer, n: int = 4) -> str:
    """Exercise 1: the sum each of `n` engines gets when every engine contributes (rank + 1) ** 2."""
    if answer is None:
        return "exercise 1: not answered yet"
    return "exercise 1: correct" if answer == sum((r + 1) ** 2 for r in range(n)) else "exercise 1: wrong"
