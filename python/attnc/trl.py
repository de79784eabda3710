"""TRL's GRPO trainer with its advantages computed by an attnc spec.

    import attnc.trl
    trainer = attnc.trl.GRPOTrainer(model, reward_funcs=judge, args=config, train_dataset=data,
                                    advantage_spec="odrpo", advantage_params={"K": 10})

TRL's ``GRPOTrainer`` computes advantages inline, in
``_generate_and_score_completions``; it offers no hook for them. This
subclass keeps everything else of TRL's and replaces only the advantages:
it records the rewards TRL gathered (``_calculate_rewards``: one column per
reward function, every process's completions), runs the spec on them, and
puts the result where TRL's own advantages were (the batch the loss reads,
and the completions log). TRL's ``scale_rewards`` and
``multi_objective_aggregation`` are then not used. Written against TRL 1.16;
the methods it relies on are checked when the trainer is built, and its tests
fail if a TRL release changes them.

The spec's inputs:

- ``rewards`` [B, G]: per completion, the reward functions' outputs times
  ``reward_weights``, summed (as TRL's default ``sum_then_normalize``; a
  function returning None counts 0, a completion no function scored is NaN,
  which attnc rejects naming its group and sample);
- or ``rewards`` [B, G, C]: one component per reward function (GDPO);
  ``reward_weights`` go to an input ``weights`` [C] if the spec has one, and
  must be all 1 otherwise.

B is the number of prompts in the generation batch (over all processes) and
G is ``num_generations`` (``num_generations_eval`` in evaluation): TRL's
completions come in groups of G consecutive rows.
"""

from __future__ import annotations

import inspect
from typing import Optional

import numpy as np

try:
    import torch
    import trl as _trl
    from trl import GRPOTrainer as _TRLGRPOTrainer
except ImportError as _missing:  # pragma: no cover - exercised without trl installed
    raise ImportError(
        "attnc.trl needs TRL (and PyTorch): `pip install trl` (attnc is tested with trl 1.16.0). "
        f"The import failed with: {_missing}"
    ) from _missing

import attnc
from . import Program

__all__ = ["GRPOTrainer", "TESTED_TRL"]

TESTED_TRL = "1.16.0"

# What this subclass relies on in TRL's GRPOTrainer: method -> parameters.
_HOOKS = {
    "_calculate_rewards": ["inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["inputs"],
}


def _check_trl() -> None:
    """Raises if TRL's GRPOTrainer no longer has the methods this subclass overrides."""
    for method, params in _HOOKS.items():
        fn = getattr(_TRLGRPOTrainer, method, None)
        found = list(inspect.signature(fn).parameters)[1:] if fn is not None else None
        if found != params:
            raise RuntimeError(
                f"attnc.trl was written against TRL {TESTED_TRL}, whose GRPOTrainer.{method} takes {params}; "
                f"TRL {_trl.__version__} has {'no such method' if found is None else found}. "
                "attnc.trl needs updating for this TRL version."
            )


def _compile(spec, params) -> Program:
    if isinstance(spec, str) and spec in attnc.stdlib():
        return attnc.compile(f"stdlib/{spec}.attn", **params)
    return attnc.compile(spec, **params)


class GRPOTrainer(_TRLGRPOTrainer):
    """``trl.GRPOTrainer`` whose advantages come from the attnc spec
    ``advantage_spec`` (a stdlib name such as ``"odrpo"``, a path or a
    spec's text) compiled with ``advantage_params``, run on ``advantage_backend``
    (default: ``"cuda"`` when the trainer's device is CUDA, else the float64
    interpreter). Every other argument is TRL's."""

    def __init__(
        self,
        *args,
        advantage_spec,
        advantage_params: Optional[dict] = None,
        advantage_backend: Optional[str] = None,
        **kwargs,
    ):
        _check_trl()
        program = _compile(advantage_spec, dict(advantage_params or {}))
        inputs = {t.name: t for t in program.inputs}
        outputs = {t.name for t in program.outputs}
        what = f"advantage_spec {advantage_spec!r}"
        if "rewards" not in inputs or len(inputs["rewards"].shape) not in (2, 3) or "advantages" not in outputs:
            raise ValueError(f"{what} must take `rewards` [B, G] or [B, G, C] and output `advantages` [B, G]")
        unknown = [n for n in inputs if n not in ("rewards", "weights")]
        if unknown:
            raise ValueError(f"{what} takes input(s) {unknown} that the trainer cannot fill")
        self.advantage_program = program
        self.advantage_spec = advantage_spec
        self.advantage_backend = advantage_backend
        self._components = len(inputs["rewards"].shape) == 3
        self._weighted = "weights" in inputs
        self._attnc_rewards = None
        super().__init__(*args, **kwargs)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._attnc_rewards = rewards_per_func  # gathered: every process's completions
        return rewards_per_func

    def _attnc_advantages(self, rewards_per_func: torch.Tensor, group: int) -> np.ndarray:
        """The spec's advantages for TRL's gathered rewards, one per completion."""
        per_func = rewards_per_func.detach().to("cpu", torch.float64)
        weights = self.reward_weights.detach().to("cpu", torch.float64)
        if per_func.shape[0] % group:
            raise ValueError(f"{per_func.shape[0]} completions do not make groups of {group}")
        if self._components:
            tensors = {"rewards": per_func.reshape(-1, group, per_func.shape[1]).numpy()}
            if self._weighted:
                tensors["weights"] = weights.numpy()
            elif not bool(torch.all(weights == 1)):
                raise ValueError(
                    f"advantage_spec {self.advantage_spec!r} takes no component weights, "
                    f"but reward_weights = {weights.tolist()}"
                )
        else:
            unscorable = torch.isnan(per_func).all(dim=1)
            rewards = (per_func * weights.unsqueeze(0)).nansum(dim=1)
            rewards[unscorable] = float("nan")
            tensors = {"rewards": rewards.reshape(-1, group).numpy()}
        backend = self.advantage_backend or ("cuda" if self.accelerator.device.type == "cuda" else "interp")
        return self.advantage_program.run(backend=backend, dtype="f64", **tensors)["advantages"].reshape(-1)

    def _generate_and_score_completions(self, inputs):
        self._attnc_rewards = None
        output = super()._generate_and_score_completions(inputs)
        if self._attnc_rewards is None:
            raise RuntimeError(
                f"TRL {_trl.__version__}'s GRPOTrainer did not compute rewards through _calculate_rewards; "
                f"attnc.trl was written against TRL {TESTED_TRL} and needs updating"
            )
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        advantages = self._attnc_advantages(self._attnc_rewards, group)
        local = output["advantages"]
        start = self.accelerator.process_index * local.shape[0]
        output["advantages"] = torch.as_tensor(advantages[start : start + local.shape[0]]).to(
            device=local.device, dtype=local.dtype
        )
        # The completions log shows the advantages the loss used.
        logged = self._logs["advantages"]
        if len(logged) >= len(advantages):
            for _ in range(len(advantages)):
                logged.pop()
            logged.extend(advantages.tolist())
        self._attnc_rewards = None
        return output
