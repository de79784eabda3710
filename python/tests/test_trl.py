"""attnc.trl: TRL's GRPOTrainer with advantages from an attnc spec.

TRL must be installed (`.ci/run` installs trl 1.16.0): without it every test
here fails, saying what to install. One optimisation step on a tiny causal
LM built from a config (no download) with a toy rating reward; the
advantages the trainer handed to its loss are checked against attnc's
interpreter on the ratings the reward function gave, and against the
estimator written independently here (1e-6; TRL keeps advantages in float32).
"""

import inspect

import numpy as np
import pytest
import torch

import attnc
import attnc.torch  # noqa: F401 (PyTorch's LLVM before lavapipe's: see attnc/torch.py)

try:
    import trl
    import attnc.trl
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig
except ImportError as e:  # fail (never skip) below, saying what is missing
    MISSING = f"TRL is not importable, so attnc.trl cannot be tested: {e}"
else:
    MISSING = None

TOL = 1e-6


@pytest.fixture(autouse=True)
def need_trl():
    if MISSING:
        pytest.fail(MISSING)


def test_the_trl_methods_attnc_overrides_are_still_there():
    # attnc.trl overrides two private methods of TRL's GRPOTrainer; a TRL release
    # that changes them fails here (and the trainer refuses to build).
    assert trl.__version__ == attnc.trl.TESTED_TRL, (
        f"attnc.trl is tested with TRL {attnc.trl.TESTED_TRL}, this is TRL {trl.__version__}: check that "
        "GRPOTrainer._calculate_rewards still returns the gathered rewards per function and that "
        "_generate_and_score_completions still returns the batch's `advantages`, then update TESTED_TRL"
    )
    for method, params in {
        "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
        "_generate_and_score_completions": ["self", "inputs"],
    }.items():
        assert list(inspect.signature(getattr(trl.GRPOTrainer, method)).parameters) == params, method
    source = inspect.getsource(trl.GRPOTrainer._generate_and_score_completions)
    assert "rewards_per_func = self._calculate_rewards(" in source and '"advantages": advantages' in source


WORDS = ["<pad>", "<eos>"] + [f"w{i}" for i in range(30)]


def tiny_model_and_tokenizer():
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="w0")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=None,
    )
    return LlamaForCausalLM(config), tokenizer


def train_one_step(tmp_path, reward_funcs, G=4, prompts=3, **trainer_kwargs):
    """One optimisation step; returns the generated batch, the advantages the
    loss read, and whether the weights moved."""
    model, tokenizer = tiny_model_and_tokenizer()
    data = Dataset.from_dict({"prompt": ["w1 w2 w3", "w4 w5", "w6 w7 w8 w9", "w3 w1", "w9"] * 4})
    seen = {"loss": []}

    class Recording(attnc.trl.GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            seen["batch"] = super()._generate_and_score_completions(inputs)
            return seen["batch"]

        def compute_loss(self, model, inputs, *args, **kwargs):
            seen["loss"].append(inputs["advantages"].detach().clone())
            return super().compute_loss(model, inputs, *args, **kwargs)

    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=G * prompts, num_generations=G, max_completion_length=6,
        max_steps=1, learning_rate=1e-2, use_cpu=True, report_to="none", save_strategy="no", seed=0, bf16=False,
        logging_steps=1,
    )
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Recording(model=model, reward_funcs=reward_funcs, args=args, train_dataset=data, processing_class=tokenizer, **trainer_kwargs)
    trainer.train()
    moved = any(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
    return seen["batch"], torch.cat(seen["loss"]), moved


def odrpo_independent(ratings, K, eps=1e-6):
    """ODRPO with a GRPO base (docs/semantics.md §4), written here: per threshold
    tau, the indicators' group mean p and population std sqrt(p(1-p))."""
    out = np.zeros(ratings.shape)
    for tau in range(2, K + 1):
        b = (ratings >= tau).astype(float)
        p = b.mean(axis=1, keepdims=True)
        active = (p > 0) & (p < 1)
        out += np.where(active, (b - p) / (np.sqrt(p * (1 - p)) + eps), 0)
    return out


def test_one_step_with_odrpo_uses_attncs_advantages(tmp_path):
    K, G = 5, 4
    ratings = []

    def judge(prompts, completions, completion_ids, **kwargs):  # a toy 1..K rating
        r = [1 + sum(ids) % K for ids in completion_ids]
        ratings.extend(r)
        return [float(x) for x in r]

    batch, used, moved = train_one_step(tmp_path, judge, G=G, advantage_spec="odrpo", advantage_params={"K": K})
    rated = np.array(ratings, dtype=np.float64).reshape(-1, G)
    got = batch["advantages"].numpy().astype(np.float64).reshape(-1, G)
    assert got.shape == rated.shape == (3, G)
    want = attnc.compile("stdlib/odrpo.attn", K=K).run(rewards=rated, dtype="f64")["advantages"]
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    np.testing.assert_allclose(got, odrpo_independent(rated, K), rtol=0, atol=TOL)
    # The loss read these advantages (TRL shuffles the batch before the loss), and they are not TRL's own.
    np.testing.assert_array_equal(np.sort(used.numpy()), np.sort(batch["advantages"].numpy()))
    trl_own = (rated - rated.mean(1, keepdims=True)) / (rated.std(1, ddof=1, keepdims=True) + 1e-4)
    assert np.abs(got - trl_own).max() > 0.1
    assert moved and np.abs(got).max() > 0.5


def test_one_step_with_gdpo_on_two_reward_functions_equals_trls_normalize_then_sum(tmp_path):
    # attnc's gdpo with Bessel's std and eps = 1e-4 is TRL's multi-objective
    # "normalize_then_sum"; written here with NumPy, as TRL computes it.
    G = 4
    seen = []

    def parity(prompts, completions, completion_ids, **kwargs):
        r = [float(sum(ids) % 2) for ids in completion_ids]
        seen.append(("parity", r))
        return r

    def size(prompts, completions, completion_ids, **kwargs):
        r = [float(len(set(ids))) / 3 for ids in completion_ids]
        seen.append(("size", r))
        return r

    batch, used, moved = train_one_step(
        tmp_path, [parity, size], G=G, advantage_spec="gdpo", advantage_params={"std": "bessel", "eps": 1e-4}
    )
    per = np.stack([np.array(dict(seen)[k], dtype=np.float32).astype(np.float64).reshape(-1, G) for k in ("parity", "size")], axis=2)
    normalized = (per - per.mean(1, keepdims=True)) / (per.std(1, ddof=1, keepdims=True) + 1e-4)
    total = normalized.sum(axis=2)
    want = (total - total.mean()) / (total.std(ddof=1) + 1e-4)
    got = batch["advantages"].numpy().astype(np.float64).reshape(-1, G)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    np.testing.assert_array_equal(np.sort(used.numpy()), np.sort(batch["advantages"].numpy()))
    assert moved and np.abs(got).max() > 0.5


def test_bad_ratings_raise_attncs_error_naming_group_and_sample(tmp_path):
    def judge(prompts, completions, completion_ids, **kwargs):
        return [7.0 if i == 5 else 1.0 + i % 3 for i in range(len(completion_ids))]

    with pytest.raises(attnc.InputError, match=r"\(group 1, sample 1\) is 7, but must be an integer in 1..=5"):
        train_one_step(tmp_path, judge, G=4, advantage_spec="odrpo", advantage_params={"K": 5})


def test_specs_the_trainer_cannot_fill_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must take `rewards`"):
        train_one_step(tmp_path, lambda completion_ids, **kw: [0.0] * len(completion_ids), advantage_spec="mha")
