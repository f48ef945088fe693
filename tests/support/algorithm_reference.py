"""Slow reference implementations, written from LI2SAO_SPEC with plain Python loops.

Nothing here imports ``trainer.algorithms``: every function works on Python lists and floats,
loops over rows and tokens, and follows the spec's wording line by line, so that the
vectorised library is checked against an independent reading of the equations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

Matrix = list[list[float]]
BoolMatrix = list[list[bool]]


def action_positions(mask_row: list[bool]) -> list[int]:
    """``u_1 < ... < u_M``."""
    return [t for t, m in enumerate(mask_row) if m]


def action_tokens(mask: BoolMatrix) -> Iterator[tuple[int, int]]:
    """``(i, t)`` of every action token, row by row."""
    for i, row in enumerate(mask):
        for t in action_positions(row):
            yield i, t


def over_actions(mask: BoolMatrix, value_at: Callable[[int, list[int], int], float]) -> Matrix:
    """``out[i][u_j] = value_at(i, u, j)`` for row ``i``'s actions ``u``; 0 off the actions."""
    out = []
    for i, row in enumerate(mask):
        u = action_positions(row)
        values = [0.0] * len(row)
        for j, t in enumerate(u):
            values[t] = value_at(i, u, j)
        out.append(values)
    return out


def members(groups: list[int], i: int) -> list[int]:
    return [j for j in range(len(groups)) if groups[j] == groups[i]]


def grpo_advantages(rewards: list[float], groups: list[int], eps: float = 1e-6) -> list[float]:
    """Eq. 2 with the unbiased std; a group of one or of equal rewards gives 0."""
    out = []
    for i in range(len(rewards)):
        g = [rewards[j] for j in members(groups, i)]
        n = len(g)
        if n == 1 or all(r == g[0] for r in g):
            out.append(0.0)
            continue
        mu = sum(g) / n
        sigma = math.sqrt(sum((r - mu) ** 2 for r in g) / (n - 1))
        out.append((rewards[i] - mu) / (sigma + eps))
    return out


def adaptive_lambda(mask: BoolMatrix, alpha: float = 1.5) -> list[float]:
    out = []
    for row in mask:
        m = sum(1 for x in row if x)
        out.append(min(1.0, max(0.0, 1.0 - 1.0 / (alpha * m))))
    return out


def skip_observation_gae(
    rewards: Matrix, values: Matrix, mask: BoolMatrix, gamma: float, lam: list[float]
) -> tuple[Matrix, Matrix]:
    """Eq. 6-7 on the action subsequence, zero bootstrap after ``u_M``."""
    advantages: Matrix = []
    returns: Matrix = []
    for i, row in enumerate(mask):
        width = len(row)
        adv = [0.0] * width
        ret = [0.0] * width
        u = action_positions(row)
        following = 0.0
        for j in range(len(u) - 1, -1, -1):
            t = u[j]
            next_value = values[i][u[j + 1]] if j + 1 < len(u) else 0.0
            delta = rewards[i][t] + gamma * next_value - values[i][t]
            following = delta + gamma * lam[i] * following
            adv[t] = following
            ret[t] = following + values[i][t]
        advantages.append(adv)
        returns.append(ret)
    return advantages, returns


def whiten(values: Matrix, mask: BoolMatrix, eps: float = 1e-8) -> Matrix:
    picked = [values[i][t] for i, row in enumerate(mask) for t, m in enumerate(row) if m]
    mean = sum(picked) / len(picked)
    std = math.sqrt(sum((x - mean) ** 2 for x in picked) / len(picked))
    return [
        [(values[i][t] - mean) / (std + eps) if m else 0.0 for t, m in enumerate(row)]
        for i, row in enumerate(mask)
    ]


def token_weights(mask: BoolMatrix, aggregation: str) -> Matrix:
    """d loss / d l_t for the two aggregations (before the minus sign)."""
    n = len(mask)
    total = sum(1 for row in mask for x in row if x)
    out = []
    for row in mask:
        m = sum(1 for x in row if x)
        w = 1.0 / (n * m) if aggregation == "seq-mean-token-mean" else 1.0 / total
        out.append([w if x else 0.0 for x in row])
    return out


def dis_loss(
    logp: Matrix,
    behavior: Matrix,
    adv: Matrix,
    mask: BoolMatrix,
    low: float,
    high: float,
    aggregation: str,
) -> tuple[float, Matrix]:
    """Eq. 8-9: loss value and d loss / d logp (``f(rho) = rho`` inside ``(low, high)``)."""
    weights = token_weights(mask, aggregation)
    loss = 0.0
    grad = [[0.0] * len(row) for row in mask]
    for i, t in action_tokens(mask):
        rho = math.exp(logp[i][t] - behavior[i][t])
        if low < rho < high:
            loss -= weights[i][t] * rho * adv[i][t]
            grad[i][t] = -weights[i][t] * rho * adv[i][t]
    return loss, grad


def ppo_loss(
    logp: Matrix,
    behavior: Matrix,
    adv: Matrix,
    mask: BoolMatrix,
    eps_low: float,
    eps_high: float,
    aggregation: str,
) -> tuple[float, Matrix, float]:
    """Eq. 1 PPO clip: loss, d loss / d logp, fraction of tokens whose clipped branch is active."""
    weights = token_weights(mask, aggregation)
    loss = 0.0
    clipped_tokens = 0
    tokens = 0
    grad = [[0.0] * len(row) for row in mask]
    for i, t in action_tokens(mask):
        tokens += 1
        a = adv[i][t]
        rho = math.exp(logp[i][t] - behavior[i][t])
        clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
        loss -= weights[i][t] * min(rho * a, clipped * a)
        active = (a > 0 and rho > 1 + eps_high) or (a < 0 and rho < 1 - eps_low)
        clipped_tokens += active
        grad[i][t] = 0.0 if active else -weights[i][t] * rho * a
    return loss, grad, clipped_tokens / tokens


def gspo_loss(
    logp: Matrix, behavior: Matrix, adv: Matrix, mask: BoolMatrix, eps_low: float, eps_high: float
) -> tuple[float, Matrix]:
    """GSPO(-token): ``s_i = exp(mean log rho)``; loss and d loss / d logp."""
    n = len(mask)
    loss = 0.0
    grad = [[0.0] * len(row) for row in mask]
    for i, row in enumerate(mask):
        u = action_positions(row)
        s = math.exp(sum(logp[i][t] - behavior[i][t] for t in u) / len(u))
        for t in u:
            a = adv[i][t]
            clipped = min(max(s, 1 - eps_low), 1 + eps_high)
            loss -= min(s * a, clipped * a) / (n * len(u))
            active = (a > 0 and s > 1 + eps_high) or (a < 0 and s < 1 - eps_low)
            grad[i][t] = 0.0 if active else -s * a / (n * len(u))
    return loss, grad


def first_difference(a: list[int], b: list[int]) -> int:
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return t
    return len(a)


def divergence_mask(
    tokens: list[list[int]], mask: BoolMatrix, rewards: list[float], groups: list[int]
) -> BoolMatrix:
    out = []
    for i, row in enumerate(mask):
        opposite = [j for j in members(groups, i) if rewards[j] != rewards[i]]
        if not opposite:
            last = action_positions(row)[-1]
            out.append([t == last for t in range(len(row))])
            continue
        d = max(first_difference(tokens[i], tokens[j]) for j in opposite)
        out.append([bool(m) and t >= d for t, m in enumerate(row)])
    return out


def residual_targets(
    returns: Matrix, rewards: list[float], groups: list[int], mask: BoolMatrix
) -> tuple[Matrix, list[bool]]:
    targets = []
    keep = []
    for i, row in enumerate(mask):
        g = [rewards[j] for j in members(groups, i)]
        mu = sum(g) / len(g)
        targets.append([returns[i][t] - mu if m else 0.0 for t, m in enumerate(row)])
        keep.append(not all(r == g[0] for r in g))
    return targets, keep


def clipped_value_loss(
    values: Matrix, old: Matrix, targets: Matrix, mask: BoolMatrix, eps_v: float
) -> tuple[float, Matrix]:
    """Eq. 10: loss and d loss / d values."""
    count = sum(1 for row in mask for x in row if x)
    loss = 0.0
    grad = [[0.0] * len(row) for row in mask]
    if count == 0:
        return 0.0, grad
    for i, t in action_tokens(mask):
        v, vo, g = values[i][t], old[i][t], targets[i][t]
        inside = abs(v - vo) < eps_v
        v_bar = vo + min(max(v - vo, -eps_v), eps_v)
        plain, clipped = (v - g) ** 2, (v_bar - g) ** 2
        loss += max(plain, clipped) / count
        if plain >= clipped:
            grad[i][t] = 2 * (v - g) / count
        else:
            grad[i][t] = 2 * (v_bar - g) / count if inside else 0.0
    return loss, grad


def cross_pairs(rewards: list[float], groups: list[int]) -> list[tuple[int, int]]:
    n = len(rewards)
    return [
        (i, j)
        for i in range(n)
        for j in range(n)
        if groups[i] == groups[j] and rewards[i] > rewards[j]
    ]


def ranking_loss(
    terminal: list[float], rewards: list[float], groups: list[int], margin: float
) -> float:
    pairs = cross_pairs(rewards, groups)
    if not pairs:
        return 0.0
    return sum(max(0.0, margin - terminal[i] + terminal[j]) for i, j in pairs) / len(pairs)


def readiness(
    terminal: list[float], rewards: list[float], groups: list[int]
) -> tuple[float | None, float | None]:
    """Eq. 12-13 on mixed groups: (explained variance, ranking accuracy)."""
    z, resid = [], []
    for i in range(len(rewards)):
        g = [rewards[j] for j in members(groups, i)]
        if all(r == g[0] for r in g):
            continue
        zi = rewards[i] - sum(g) / len(g)
        z.append(zi)
        resid.append(zi - terminal[i])

    def pvar(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / len(xs)

    ev = None if not z else 1 - pvar(resid) / pvar(z)
    pairs = cross_pairs(rewards, groups)
    acc = None if not pairs else sum(terminal[i] > terminal[j] for i, j in pairs) / len(pairs)
    return ev, acc


def policy_lag(version: int, versions: list[list[int]], mask: BoolMatrix) -> list[int]:
    return [
        version - min(versions[i][t] for t in action_positions(row)) for i, row in enumerate(mask)
    ]


def off_policy_ratio(version: int, versions: list[list[int]], mask: BoolMatrix) -> float:
    stale = total = 0
    for i, row in enumerate(mask):
        for t in action_positions(row):
            total += 1
            stale += version - versions[i][t] > 1
    return stale / total


# --- PACT and SR-PPO (PACT_SRPPO_SPEC), same rules: lists, loops, the spec's wording ---


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def softplus(z: float) -> float:
    """``log(1 + e^z)``, written so that it does not overflow."""
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


def normalize_rewards(rewards: list[float], low: float, high: float) -> list[float]:
    """``R~ = (R - R_min) / (R_max - R_min)``; outside the range is an error."""
    if not high > low:
        raise ValueError("reward_max <= reward_min")
    for r in rewards:
        if r < low or r > high:
            raise ValueError(f"reward {r} outside [{low}, {high}]")
    return [(r - low) / (high - low) for r in rewards]


def pact_advantages(
    rewards: list[float], values: Matrix, mask: BoolMatrix, gamma: float = 1.0
) -> Matrix:
    """GAE with lambda = 1, outcome reward on ``u_M``: ``A_{u_j} = gamma^(M-j) R - V(s_{u_j})``."""
    return over_actions(
        mask, lambda i, u, j: gamma ** (len(u) - 1 - j) * rewards[i] - values[i][u[j]]
    )


def pact_credit(
    rewards: list[float], values: Matrix, mask: BoolMatrix, gamma: float = 1.0
) -> Matrix:
    """Theorem 1: ``C_{u_j} = gamma V(s_{u_{j+1}}) - V(s_{u_j})``, ``C_{u_M} = R - V(s_{u_M})``."""

    def credit(i: int, u: list[int], j: int) -> float:
        if j + 1 < len(u):
            return gamma * values[i][u[j + 1]] - values[i][u[j]]
        return rewards[i] - values[i][u[j]]

    return over_actions(mask, credit)


def tis_weights(old: Matrix, behavior: Matrix, mask: BoolMatrix, low: float, high: float) -> Matrix:
    """``w_t = clip(exp(old_t - mu_t), low, high)`` on action tokens, 0 elsewhere."""
    return [
        [min(max(math.exp(old[i][t] - behavior[i][t]), low), high) if m else 0.0
         for t, m in enumerate(row)]
        for i, row in enumerate(mask)
    ]  # fmt: skip


def critic_is_weights(new: Matrix, old: Matrix, mask: BoolMatrix, mode: str) -> Matrix:
    """``W_{u_j}`` of the four modes, each product/sum written out over ``k >= j``."""

    def weight(i: int, u: list[int], j: int) -> float:
        c = [math.exp(new[i][t] - old[i][t]) for t in u[j:]]  # c_{u_j}, ..., c_{u_M}
        if mode == "none":
            return 1.0
        if mode == "token":
            return c[0]
        if mode == "product":
            product = 1.0
            for c_k in c:
                product *= c_k
            return product
        if mode == "first_order":
            return 1.0 + sum(c_k - 1.0 for c_k in c)
        raise ValueError(mode)

    return over_actions(mask, weight)


def pact_critic_targets(
    rewards: list[float],
    new: Matrix,
    old: Matrix,
    mask: BoolMatrix,
    mode: str,
    low: float = 0.0,
    high: float = 6.0,
) -> tuple[Matrix, BoolMatrix]:
    """``y = W R``; keep = action and ``low <= W <= high`` (every action for ``"none"``)."""
    weights = critic_is_weights(new, old, mask, mode)
    targets = [[w * rewards[i] for w in row] for i, row in enumerate(weights)]
    keep = [
        [bool(m) and (mode == "none" or low <= weights[i][t] <= high) for t, m in enumerate(row)]
        for i, row in enumerate(mask)
    ]
    return targets, keep


def bce_value_loss(
    logits: Matrix, targets: Matrix, mask: BoolMatrix, a: float = 1.0, b: float = 0.0
) -> tuple[float, Matrix]:
    """``sum m [a (softplus(z) - y z) + b (sigmoid(z) - y)^2] / max(1, sum m)`` and d/dz."""
    count = max(1, sum(1 for row in mask for x in row if x))
    loss = 0.0
    grad = [[0.0] * len(row) for row in mask]
    for i, t in action_tokens(mask):
        z, y = logits[i][t], targets[i][t]
        s = sigmoid(z)
        loss += (a * (softplus(z) - y * z) + b * (s - y) ** 2) / count
        grad[i][t] = (a * (s - y) + b * 2 * (s - y) * s * (1 - s)) / count
    return loss, grad


def passk_weight(value: float, k: float) -> float:
    """``k (1 - q)^(k - 1)`` with ``q = clamp(value, 0, 1)`` (Python's ``0.0 ** 0 == 1``)."""
    q = min(max(value, 0.0), 1.0)
    return k * (1.0 - q) ** (k - 1)


def srppo_advantages(
    rewards: list[float], values: Matrix, mask: BoolMatrix, k: float, gamma: float = 1.0
) -> Matrix:
    """``A_{u_j} = w^_i (gamma^(M-j) R_i - V(s_{u_j}))`` with ``w^_i`` from ``V(s_{u_1})``."""

    def advantage(i: int, u: list[int], j: int) -> float:
        w = passk_weight(values[i][u[0]], k)
        return w * (gamma ** (len(u) - 1 - j) * rewards[i] - values[i][u[j]])

    return over_actions(mask, advantage)


def pact_actor_loss(
    logp: Matrix,
    old: Matrix,
    behavior: Matrix,
    adv: Matrix,
    mask: BoolMatrix,
    kind: str,
    low: float,
    high: float,
    tis_high: float = 2.0,
) -> tuple[float, Matrix]:
    """PACT's actor loss token by token, TIS written as a factor of the loss (not folded).

    ``rho = exp(logp - old)``, ``w = clip(exp(old - mu), 0, tis_high)``; ``kind="dis"``:
    ``l = w f(rho) A`` with ``f`` the DIS window ``(low, high)``; ``kind="ppo"``:
    ``l = w min(rho A, clip(rho, 1 - low, 1 + high) A)``. Seq-mean-token-mean; loss = -J.
    """
    weights = token_weights(mask, "seq-mean-token-mean")
    loss = 0.0
    grad = [[0.0] * len(row) for row in mask]
    for i, t in action_tokens(mask):
        rho = math.exp(logp[i][t] - old[i][t])
        w = min(math.exp(old[i][t] - behavior[i][t]), tis_high)
        a = adv[i][t]
        if kind == "dis":
            inside = low < rho < high
            term, slope = (w * rho * a, w * rho * a) if inside else (0.0, 0.0)
        else:
            clipped = min(max(rho, 1 - low), 1 + high)
            term = w * min(rho * a, clipped * a)
            active = (a > 0 and rho > 1 + high) or (a < 0 and rho < 1 - low)
            slope = 0.0 if active else w * rho * a
        loss -= weights[i][t] * term
        grad[i][t] = -weights[i][t] * slope
    return loss, grad
