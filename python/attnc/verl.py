"""attnc's group-advantage estimators as verl advantage estimators.

    import attnc.verl
    attnc.verl.register("attnc_odrpo", "odrpo", K=10)     # then algorithm.adv_estimator=attnc_odrpo

:func:`register` compiles a spec and registers, through verl's own
``register_adv_est``, a function with verl's advantage-estimator signature
``(token_level_rewards, response_mask, index, config=None, **kwargs) ->
(advantages, returns)``. It does the glue a trainer needs: each response's
score is the sum of its token-level rewards (as verl's outcome estimators
do), responses are grouped by ``index`` (verl's prompt uids, in any order),
the spec runs on the groups, and each response's advantage is broadcast over
its tokens and multiplied by ``response_mask``; ``returns`` is
``advantages``, as in verl's GRPO.

A spec runs on a ``[B, G]`` matrix (B groups of G responses), so groups of
unequal size (after filtering) run as one launch per size. A spec whose
groups are not independent (it standardises over the whole batch: GDPO,
ODRPO with ``batch_norm``) cannot be split so: with unequal sizes it is an
error, unless the spec takes a ``tokens`` input, whose 0s mark padding (as
:data:`GDPO_VERL` does); then all groups run in one launch, padded to the
largest. The inputs attnc.verl fills:

- ``rewards``: ``[B, G]`` scores, or ``[B, G, C]`` reward components. The
  components come from ``non_tensor_batch[key]`` for each key of the config's
  ``gdpo_reward_keys`` (verl hands ``non_tensor_batch`` only to the estimator
  named ``"gdpo"``: register such a spec as ``"gdpo"`` with
  ``replace=True``); without keys, the score is the one component.
- ``tokens`` (optional, ``[B, G, 1]``): each response's number of tokens
  (``response_mask.sum(-1)``), 0 for padding.
- ``weights`` (optional, ``[C]``): the config's ``gdpo_reward_weights``, or 1s.

Errors attnc finds in the rewards (a rating out of range, a reward that is not
0 or 1, a NaN) are raised as attnc's :class:`attnc.InputError`, naming the
group and sample of the launch and the verl response they came from (its
batch row and uid).
"""

from __future__ import annotations

import re
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

try:
    import torch
    from verl.trainer.ppo import core_algos as _core_algos
except ImportError as _missing:  # pragma: no cover - exercised without verl installed
    raise ImportError(
        "attnc.verl needs verl (and PyTorch): `pip install verl` (attnc is tested with verl 0.9.1; "
        "`pip install --no-deps verl==0.9.1` plus ray, tensordict, omegaconf, transformers and "
        f"codetiming is enough for its advantage estimators). The import failed with: {_missing}"
    ) from _missing

import attnc
from . import InputError, Program

__all__ = ["register", "GDPO_VERL"]

# verl's GDPO (verl.trainer.ppo.core_algos.compute_gdpo_outcome_advantage,
# verl 0.9): per component, GRPO within the group (Bessel's std, eps); the
# components weighted and summed; then whitened over all response *tokens*
# (verl_F.masked_whiten: each response counts once per token, the variance
# has Bessel's correction over tokens, and it divides by sqrt(var + 1e-8)).
# attnc's `gdpo` standardises over responses instead, and cannot take the
# token counts (an input it would always need), so this is its own spec.
# Padding (tokens = 0) is masked out: groups of any sizes run as one launch.
GDPO_VERL = """\
// verl's GDPO (verl 0.9 core_algos.compute_gdpo_outcome_advantage), for attnc.verl:
// per reward component, GRPO within each group (Bessel's std, eps); components
// weighted and summed; then whitened over all response tokens. A response with
// tokens = 0 is padding: it takes no part and gets 0. As everywhere in attnc, a
// component whose rewards are all equal in a group (a group of one sample too)
// contributes 0 (verl gives a group of one sample mean 0 and std 1).
spec gdpo_verl

param eps: float = 1e-6          // added to each group's standard deviation
param norm_by_std: bool = true   // false: per-component r - mean (verl's norm_adv_by_std_in_grpo)
param whiten_eps: float = 1e-8   // verl's masked_whiten: (x - m) / sqrt(var + 1e-8)

require eps >= 0, "eps must be non-negative"
require whiten_eps >= 0, "whiten_eps must be non-negative"

dim B = 4  // groups (prompts)
dim G = 8  // responses per group (the largest group; smaller ones padded)
dim C = 3  // reward components

input rewards: [B, G, C] in finite
input weights: [C] in finite                          // component weights
input tokens: [B, G, 1] in integers(0, 1000000000)    // tokens per response; 0 = padding

let valid = tokens > 0                                // [B, G, 1]
let n = sum(valid, axis = 1)                          // [B, 1, 1] responses per group
let mu = sum(valid * rewards, axis = 1) / maximum(n, 1)
let dev = rewards - mu
let sigma = sqrt(sum(valid * dev * dev, axis = 1) / maximum(n - 1, 1))
let hi = max(where(valid, rewards, -1e30), axis = 1)
let lo = min(where(valid, rewards, 1e30), axis = 1)
let per = where(hi > lo, if norm_by_std then dev / (sigma + eps) else dev, 0)
let total = sum(valid * per * weights, axis = 2)      // [B, G, 1]

let T = sum(tokens, axis = all)                       // all response tokens
let m = sum(tokens * total, axis = all) / (T + whiten_eps)
let v = sum(tokens * (total - m) * (total - m), axis = all) / (T + whiten_eps) * (T / (T - 1))

output advantages = sum(where(valid, (total - m) / sqrt(v + whiten_eps), 0), axis = 2, keepdim = false)
"""

# Specs attnc.verl knows by name besides the stdlib's.
_SPECS = {"gdpo_verl": GDPO_VERL}

# verl's trainer (ray_trainer.compute_advantage) computes these itself
# without consulting the registry: a registration under them would never run.
_BYPASSED = ("gae", "grpo")


def _compile(spec, params) -> Program:
    if isinstance(spec, str) and spec in _SPECS:
        return attnc.compile(_SPECS[spec], **params)
    if isinstance(spec, str) and spec in attnc.stdlib():
        return attnc.compile(f"stdlib/{spec}.attn", **params)
    return attnc.compile(spec, **params)


def _layout(program: Program, what: str) -> Tuple[int, bool, bool]:
    """Checks that the spec takes what a trainer can fill; returns the rank
    of ``rewards`` and whether it takes ``tokens`` and ``weights``."""
    inputs = {t.name: t for t in program.inputs}
    outputs = {t.name: t for t in program.outputs}
    if "rewards" not in inputs or len(inputs["rewards"].shape) not in (2, 3):
        raise ValueError(f"{what} must take `rewards` [B, G] (or [B, G, C]); its inputs are {list(inputs)}")
    if "advantages" not in outputs or len(outputs["advantages"].shape) != 2:
        raise ValueError(f"{what} must output `advantages` [B, G]; its outputs are {list(outputs)}")
    rank = len(inputs["rewards"].shape)
    unknown = [n for n in inputs if n not in ("rewards", "tokens", "weights")]
    if unknown:
        raise ValueError(
            f"{what} takes input(s) {unknown} that a trainer cannot fill "
            "(filled: `rewards`, and optionally `tokens` [B, G, 1] and `weights` [C])"
        )
    if "tokens" in inputs and len(inputs["tokens"].shape) != 3:
        raise ValueError(f"{what}: `tokens` must be [B, G, 1]")
    if "weights" in inputs and (rank != 3 or len(inputs["weights"].shape) != 1):
        raise ValueError(f"{what}: `weights` must be [C], with `rewards` [B, G, C]")
    return rank, "tokens" in inputs, "weights" in inputs


def _rows_independent(program: Program) -> bool:
    """Whether each group's advantages depend on its own rewards only: the
    first two groups of a sampled batch give the same advantages alone."""
    drawn = program.sample(seed=0)
    whole = program.run(dtype="f64", **drawn)["advantages"]
    part = program.run(dtype="f64", **{n: a[:2] if n == "rewards" else a for n, a in drawn.items()})["advantages"]
    return bool(np.allclose(whole[:2], part, rtol=1e-12, atol=1e-12))


_WHERE = re.compile(r"\[(\d+), (\d+)(?:, \d+)?\] \(group \d+, sample \d+\)")


def _explained(error: InputError, rows: np.ndarray, uids: List[object]) -> InputError:
    """attnc's error about launch entry [b, g], with the verl response it came from
    (or, for an error about no one entry, the groups of the launch)."""
    found = _WHERE.search(str(error))
    b, g = (int(found.group(1)), int(found.group(2))) if found else (-1, -1)
    if 0 <= b < rows.shape[0] and 0 <= g < rows.shape[1] and rows[b, g] >= 0:
        text = (
            f"{error} — verl's response at batch row {int(rows[b, g])} (uid {uids[b]!r}, "
            f"response {g} of its group)"
        )
    else:
        shown = ", ".join(repr(u) for u in uids[:4]) + (", ..." if len(uids) > 4 else "")
        text = f"{error} — in the launch of verl's groups of {rows.shape[1]} responses (uids {shown})"
    out = InputError(text)
    out.code, out.tensor = getattr(error, "code", None), getattr(error, "tensor", None)
    return out


def _config_get(config, key):
    if config is None:
        return None
    if hasattr(config, "get"):
        return config.get(key, None)
    return getattr(config, key, None)


class _Estimator:
    """The function registered with verl (see :func:`register`)."""

    def __init__(self, name: str, spec, program: Program, backend: Optional[str]):
        self.name, self.spec, self.program, self.backend = name, spec, program, backend
        what = f"spec `{spec}`"
        self.rank, self.padded, self.weighted = _layout(program, what)
        self._independent: Optional[bool] = None
        self._no_cuda = False
        self.__name__ = self.__qualname__ = f"attnc_{name}"
        self.__doc__ = f"verl advantage estimator `{name}`: attnc spec {spec!r} ({program!r})."

    def __repr__(self) -> str:
        return f"<attnc.verl estimator {self.name!r}: {self.spec!r}>"

    def _components(self, scores: torch.Tensor, config, non_tensor_batch) -> Tuple[np.ndarray, np.ndarray]:
        """[bs, C] rewards and [C] weights."""
        keys = _config_get(config, "gdpo_reward_keys")
        if self.rank == 2:
            return scores[:, None], np.ones(1)
        if keys:
            if non_tensor_batch is None:
                raise ValueError(
                    f"estimator `{self.name}` takes reward components (algorithm.gdpo_reward_keys = {list(keys)}), "
                    "but verl passed no non_tensor_batch: verl hands it only to the estimator named `gdpo`, "
                    "so register this spec as `gdpo` (replace=True)"
                )
            missing = [k for k in keys if k not in non_tensor_batch]
            if missing:
                raise KeyError(
                    f"reward component(s) {missing} not in non_tensor_batch (keys: {list(non_tensor_batch.keys())})"
                )
            rewards = np.stack([np.asarray(non_tensor_batch[k], dtype=np.float64) for k in keys], axis=1)
        else:
            rewards = scores[:, None]
        given = _config_get(config, "gdpo_reward_weights")
        weights = np.asarray(list(given), dtype=np.float64) if given is not None else np.ones(rewards.shape[1])
        if weights.shape != (rewards.shape[1],):
            raise ValueError(f"{len(weights)} reward weights for {rewards.shape[1]} reward components")
        if not self.weighted and not np.all(weights == 1):
            raise ValueError(f"spec `{self.spec}` takes no component weights, but gdpo_reward_weights = {list(weights)}")
        return rewards, weights

    def _run(self, tensors: Dict[str, np.ndarray], device: torch.device, rows: np.ndarray, uids) -> np.ndarray:
        backend = self.backend
        if backend is None:
            backend = "cuda" if device.type == "cuda" and not self._no_cuda else "interp"
        try:
            return self.program.run(backend=backend, dtype="f64", **tensors)["advantages"]
        except InputError as e:
            raise _explained(e, rows, uids) from e
        except attnc.DeviceError as e:
            if self.backend is not None or backend == "interp":
                raise
            # No CUDA backend serves this process: the interpreter does (once told).
            self._no_cuda = True
            warnings.warn(f"attnc.verl: the CUDA backend is not available ({e}); running on the interpreter")
            return self._run(tensors, device, rows, uids)

    def __call__(
        self,
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: Optional[np.ndarray] = None,
        config=None,
        non_tensor_batch: Optional[dict] = None,
        **kwargs,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        for key in ("epsilon", "norm_adv_by_std_in_grpo"):
            if key in kwargs:
                raise TypeError(
                    f"`{key}` is a parameter of the spec, fixed when `{self.name}` was registered "
                    "(e.g. eps=..., or the dr_grpo spec for no std normalisation)"
                )
        if index is None:
            raise ValueError(f"estimator `{self.name}` groups responses by `index` (verl's non_tensor_batch['uid'])")
        with torch.no_grad():
            scores = token_level_rewards.sum(dim=-1)
            bs = scores.shape[0]
            index = np.asarray(index.tolist() if hasattr(index, "tolist") else list(index), dtype=object)
            if index.shape != (bs,):
                raise ValueError(f"`index` has shape {index.shape}, but there are {bs} responses")
            rewards, weights = self._components(scores.detach().to("cpu", torch.float64).numpy(), config, non_tensor_batch)
            groups: Dict[object, List[int]] = {}
            for i, uid in enumerate(index.tolist()):
                groups.setdefault(uid, []).append(i)
            uids = list(groups)
            advantages = np.zeros(bs)
            device = token_level_rewards.device
            if self.padded:
                tokens = response_mask.detach().sum(dim=-1).to("cpu", torch.float64).numpy()
                if tokens.sum() <= 1:
                    raise ValueError("whitening over tokens needs at least 2 response tokens in the batch")
                width = max(len(m) for m in groups.values())
                rows = np.full((len(uids), width), -1)
                for b, uid in enumerate(uids):
                    rows[b, : len(groups[uid])] = groups[uid]
                take = np.maximum(rows, 0)
                pad = rows < 0
                r = rewards[take]
                r[pad] = 0
                t = tokens[take]
                t[pad] = 0
                if np.any(t[~pad] <= 0):
                    b, g = np.argwhere((t <= 0) & ~pad)[0]
                    raise ValueError(
                        f"verl's response at batch row {rows[b, g]} (uid {uids[b]!r}) has no tokens in response_mask; "
                        f"spec `{self.spec}` reads 0 tokens as padding"
                    )
                tensors = {"rewards": r if self.rank == 3 else r[..., 0], "tokens": t[..., None]}
                if self.weighted:
                    tensors["weights"] = weights
                out = self._run(tensors, device, rows, uids)
                advantages[rows[~pad]] = out[~pad]
            else:
                sizes = sorted({len(m) for m in groups.values()})
                if len(sizes) > 1:
                    if self._independent is None:
                        self._independent = _rows_independent(self.program)
                    if not self._independent:
                        raise ValueError(
                            f"spec `{self.spec}` couples the groups of a batch (it standardises over the whole batch), "
                            f"so groups of unequal sizes {sizes} cannot run one size at a time without changing "
                            "its result; keep group sizes equal, or use a spec that takes `tokens` (padding)"
                        )
                for size in sizes:
                    members = [u for u in uids if len(groups[u]) == size]
                    rows = np.array([groups[u] for u in members])
                    tensors = {"rewards": rewards[rows] if self.rank == 3 else rewards[rows][..., 0]}
                    if self.weighted:
                        tensors["weights"] = weights
                    out = self._run(tensors, device, rows, members)
                    advantages[rows] = out
            result = torch.from_numpy(advantages).to(device=device, dtype=scores.dtype)
            result = result.unsqueeze(-1) * response_mask
        return result, result


def register(name: str, spec, *, replace: bool = False, backend: Optional[str] = None, **params) -> Callable:
    """Compile ``spec`` (a path, a spec's text, a stdlib name such as
    ``"odrpo"``, or ``"gdpo_verl"``) with ``params`` bound, and register it
    with verl as advantage estimator ``name`` (``algorithm.adv_estimator``).
    Returns the registered function, which may also be called directly.

    A name verl already holds is refused as verl's ``register_adv_est``
    refuses it (ValueError), unless ``replace=True``. ``"grpo"`` and
    ``"gae"`` are refused: verl's trainer computes those itself without the
    registry. ``backend`` (``"interp"``, ``"wgpu"``, ``"cuda"``) overrides
    the default: CUDA for CUDA tensors where attnc's CUDA backend serves the
    process, else the interpreter (float64)."""
    if not isinstance(name, str):
        name = getattr(name, "value", name)
    if name in _BYPASSED:
        raise ValueError(
            f"verl's trainer computes `{name}` itself, without its estimator registry, so a registration "
            f"under that name would never run; register under another name (e.g. `attnc_{name}`)"
        )
    estimator = _Estimator(name, spec, _compile(spec, params), backend)
    if replace:
        _core_algos.ADV_ESTIMATOR_REGISTRY.pop(name, None)
    return _core_algos.register_adv_est(name)(estimator)
