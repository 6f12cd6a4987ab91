"""Rules that pick an option per scenario: depth-limited decision trees learned by exhaustive search.

Shared by the C3 strategy rule (``c3_rules``) and the FiCCO schedule rule (``ficco_rules``). A scenario has
features (a DataFrame row) and a time per option (a DataFrame column each); regret of a pick =
T(pick) / T(best option) - 1. ``learn`` finds the binary tree of depth <= ``depth`` over the candidate
``Test``s with the least total training regret (exact for this family: below a test each side's best subtree
is independent); a test is kept only if it lowers the mean training regret by at least ``min_gain``; a leaf
holds at least ``min_leaf`` scenarios. Ties keep the simpler tree, then the earlier test / option in a fixed
order, so the result is deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import pandas as pd

BEST_TOL, NEAR_TOL = 1e-3, 0.05


def skipped(df: pd.DataFrame) -> pd.Series:
    """Rows that record a reason instead of a measurement."""
    return df["skipped"].notna() & (df["skipped"].astype(str).str.len() > 0)


@dataclass(frozen=True)
class Test:
    feature: str
    value: object
    numeric: bool

    def mask(self, feats: pd.DataFrame) -> np.ndarray:
        col = feats[self.feature]
        return (col.to_numpy(dtype=float) <= self.value) if self.numeric else (col == self.value).to_numpy()

    def __str__(self) -> str:
        return f"{self.feature} <= {self.value:g}" if self.numeric else f"{self.feature} == {self.value}"


@dataclass
class Node:
    pick: Optional[str] = None
    test: Optional[Test] = None
    yes: Optional["Node"] = None
    no: Optional["Node"] = None

    def predict(self, feats: pd.DataFrame) -> np.ndarray:
        if self.test is None:
            return np.full(len(feats), self.pick, dtype=object)
        m = self.test.mask(feats)
        return np.where(m, self.yes.predict(feats), self.no.predict(feats))

    def leaves(self) -> int:
        return 1 if self.test is None else self.yes.leaves() + self.no.leaves()

    def text(self, indent: str = "") -> str:
        if self.test is None:
            return f"{indent}use {self.pick}"
        return (f"{indent}if {self.test}:\n{self.yes.text(indent + '    ')}\n{indent}else:\n"
                f"{self.no.text(indent + '    ')}")


def learn(feats: pd.DataFrame, times: pd.DataFrame, candidates: Sequence[Test], depth: int = 2, min_leaf: int = 3,
          min_gain: float = 0.005) -> Node:
    """The tree of least training regret whose nodes test ``candidates``."""
    regret = (times.to_numpy() / times.min(axis=1).to_numpy()[:, None]) - 1.0
    names = list(times.columns)
    tests = [(t, t.mask(feats)) for t in candidates]
    gain = min_gain * len(feats)

    def best(mask: np.ndarray, d: int) -> tuple[Node, float]:
        costs = regret[mask].sum(axis=0)
        tree, cost = Node(pick=names[int(np.argmin(costs))]), float(costs.min())
        if d == 0:
            return tree, cost
        for t, m in tests:
            yes, no = mask & m, mask & ~m
            if yes.sum() < min_leaf or no.sum() < min_leaf:
                continue
            (ty, cy), (tn, cn) = best(yes, d - 1), best(no, d - 1)
            if cy + cn < cost - gain:
                tree, cost = Node(test=t, yes=ty, no=tn), cy + cn
        return tree, cost

    return best(np.ones(len(feats), dtype=bool), depth)[0]


def pick(table: pd.DataFrame, picks: np.ndarray) -> np.ndarray:
    """Each scenario's value in its picked option's column."""
    col = {name: i for i, name in enumerate(table.columns)}
    return table.to_numpy()[np.arange(len(table)), [col[p] for p in picks]]


def score(picks: np.ndarray, times: pd.DataFrame) -> dict:
    chosen, best = pick(times, picks), times.to_numpy().min(axis=1)
    return {"scenarios": len(times), "accuracy": float(np.mean(chosen <= best * (1 + BEST_TOL))),
            "within_5pct": float(np.mean(chosen <= best * (1 + NEAR_TOL))),
            "mean_regret": float(np.mean(chosen / best - 1))}




def by_option(coll: pd.DataFrame, keys: Sequence[str], value: str, default: str, worst) -> pd.DataFrame:
    """``value`` per scenario (rows) and option (columns); an option that did not run in a scenario gets the
    ``default`` option's value there (a runtime that cannot run its pick runs the default), else ``worst`` of the
    row."""
    table = coll.pivot_table(index=list(keys), columns="option", values=value, aggfunc="first")
    fallback = table[default] if default in table else worst(table, axis=1)
    return table.apply(lambda col: col.fillna(fallback))


def learn_and_score(feats: pd.DataFrame, times: pd.DataFrame, test: np.ndarray, candidates: Sequence[Test],
                    default: str, depth: int, min_leaf: int, min_gain: float, extra=None) -> tuple[Node, pd.DataFrame]:
    """The rule learned on the scenarios outside ``test``, and its scores on both sets next to two references:
    always the single best option on train, always ``default``. ``extra(picks, mask)`` adds columns to a row."""
    rule = learn(feats[~test], times[~test], candidates, depth, min_leaf, min_gain)
    single = learn(feats[~test], times[~test], candidates, 0)
    refs = [("rule", rule), ("always " + str(single.pick), single)]
    refs += [("always " + default, Node(pick=default))] if default in times and single.pick != default else []
    rows = []
    for name, model in refs:
        for part, m in (("train", ~test), ("test", test)):
            if m.any():
                picks = model.predict(feats[m])
                rows.append({"model": name, "set": part, **score(picks, times[m]),
                             **(extra(picks, m) if extra else {})})
    return rule, pd.DataFrame(rows)
