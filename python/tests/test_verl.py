"""attnc's estimators registered with verl (attnc.verl), against verl's own.

verl must be installed (`.ci/run` installs verl 0.9.1): without it every test
here fails, saying what to install. Batches are verl's layout: interleaved
prompt uids, right-padded responses of uneven lengths, groups of uneven
sizes. verl computes in float32; the tolerance against its estimators is
1e-6 (absolute, on advantages of order 1). The estimators are called the way
verl's trainer calls them: through verl's own `compute_advantage` (the
dispatch to the registry in verl/trainer/ppo/ray_trainer.py, taken from its
source: importing that module needs verl's whole training stack).
"""

import ast
import importlib.util
import os
import pathlib
import subprocess
import sys
from typing import Optional

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import attnc
import attnc.torch  # noqa: F401 (PyTorch's LLVM before lavapipe's: see attnc/torch.py)

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("ATTNC_BIN", str(ROOT / "target" / "debug" / "attnc"))

try:
    import attnc.verl
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
except ImportError as e:  # fail (never skip) below, saying what is missing
    MISSING = f"verl is not importable, so attnc.verl cannot be tested: {e}"
else:
    MISSING = None
    # verl's own estimators, as imported (tests run after every module is
    # imported; docs/python.md's examples, run by test_attnc.py, register some).
    VERLS_OWN = dict(core_algos.ADV_ESTIMATOR_REGISTRY)

TOL = 1e-6


@pytest.fixture(autouse=True)
def verl_registry():
    """Fails without verl; each test starts from verl's own estimators, and
    the registry is put back as it was after it."""
    if MISSING:
        pytest.fail(MISSING)
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    saved = dict(registry)
    registry.clear()
    registry.update(VERLS_OWN)
    yield registry
    registry.clear()
    registry.update(saved)


def verl_compute_advantage():
    """verl's `compute_advantage` (ray_trainer.py), compiled from verl's source."""
    path = importlib.util.find_spec("verl.trainer.ppo.ray_trainer").origin
    tree = ast.parse(pathlib.Path(path).read_text(encoding="utf-8"))
    wanted = {"compute_response_mask", "compute_advantage"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in body} == wanted, f"verl's {path} no longer defines {wanted}"
    names = {
        "DataProto": DataProto,
        "AdvantageEstimator": core_algos.AdvantageEstimator,
        "core_algos": core_algos,
        "AlgoConfig": AlgoConfig,
        "Optional": Optional,
        "torch": torch,
        "np": np,
    }
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), names)
    return names["compute_advantage"]


class Batch:
    """A verl batch: responses of `sizes[k]` samples for prompt k, shuffled
    (uids interleaved), right-padded to L tokens with uneven lengths; each
    response's score on its last token, or with `split`, split over its first
    and last (the sum, in float32, then rounds: not for ratings)."""

    def __init__(self, sizes, scores, L=9, P=3, seed=0, dtype=torch.float32, components=None, split=True):
        rng = np.random.default_rng(seed)
        uids = np.array([f"uid-{k}" for k, s in enumerate(sizes) for _ in range(s)], dtype=object)
        order = rng.permutation(len(uids))
        self.uids = uids[order]
        self.scores = np.asarray(scores, dtype=np.float64)[order]
        bs = len(uids)
        self.lengths = rng.integers(1, L + 1, size=bs)
        self.lengths[0] = L
        mask = (np.arange(L)[None, :] < self.lengths[:, None]).astype(np.int64)
        tlr = np.zeros((bs, L))
        first = rng.uniform(-0.5, 0.5, size=bs) if split else np.zeros(bs)
        tlr[:, 0] = first
        tlr[np.arange(bs), self.lengths - 1] += self.scores - first
        self.token_level_rewards = torch.tensor(tlr, dtype=dtype)
        self.response_mask = torch.tensor(mask)
        self.prompts = torch.ones(bs, P, dtype=torch.int64)
        self.attention_mask = torch.cat([torch.ones(bs, P, dtype=torch.int64), self.response_mask], dim=1)
        self.components = {k: np.asarray(v, dtype=np.float32)[order] for k, v in (components or {}).items()}

    def kwargs(self):
        return dict(token_level_rewards=self.token_level_rewards.clone(), response_mask=self.response_mask, index=self.uids)

    def data(self):
        tensors = {
            "token_level_rewards": self.token_level_rewards.clone(),
            "responses": torch.ones_like(self.response_mask),
            "prompts": self.prompts,
            "attention_mask": self.attention_mask,
        }
        return DataProto.from_dict(tensors=tensors, non_tensors={"uid": self.uids, **self.components})

    def per_response(self, advantages):
        """[bs] advantages from [bs, L], checking they fill each response's tokens and nothing else."""
        a = advantages.detach().to(torch.float64).numpy()
        mask = self.response_mask.numpy().astype(bool)
        assert np.all(a[~mask] == 0)
        values = a[:, 0]
        assert np.all(a == values[:, None] * mask)
        return values


SIZES = [4, 3, 5, 4, 2, 5, 3]  # uneven; no group of one (verl's convention for those differs: see below)


def normal_scores(sizes, seed, equal_group=None):
    s = np.random.default_rng(seed).standard_normal(sum(sizes)).astype(np.float32).astype(np.float64)
    if equal_group is not None:  # a group whose scores are all equal (exactly representable)
        start = sum(sizes[:equal_group])
        s[start : start + sizes[equal_group]] = 1.0
    return s


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grpo_dr_grpo_and_rloo_match_verls_own(dtype):
    compute_advantage = verl_compute_advantage()
    batch = Batch(SIZES, normal_scores(SIZES, 1, equal_group=2), dtype=dtype)
    cases = [
        ("attnc_grpo", "grpo", {"std": "bessel", "eps": 1e-6}, dict(fn=core_algos.compute_grpo_outcome_advantage)),
        ("attnc_dr_grpo", "dr_grpo", {}, dict(fn=core_algos.compute_grpo_outcome_advantage, norm_adv_by_std_in_grpo=False)),
        ("attnc_rloo", "rloo", {}, dict(fn=core_algos.compute_rloo_outcome_advantage)),
    ]
    for name, spec, params, ref in cases:
        fn = attnc.verl.register(name, spec, **params)
        assert core_algos.get_adv_estimator_fn(name) is fn
        out = compute_advantage(batch.data(), adv_estimator=name, config=AlgoConfig(adv_estimator=name))
        ref = dict(ref)
        want, want_returns = ref.pop("fn")(**batch.kwargs(), **ref)
        assert out.batch["advantages"].dtype == dtype
        assert torch.equal(out.batch["returns"], out.batch["advantages"])
        got = batch.per_response(out.batch["advantages"])
        np.testing.assert_allclose(got, batch.per_response(want), rtol=0, atol=TOL, err_msg=name)
        # The returned function is the registered one, callable directly.
        direct, returns = fn(**batch.kwargs())
        assert torch.equal(direct, out.batch["advantages"]) and torch.equal(returns, direct)
        assert np.abs(got).max() > 0.5


def gdpo_batch(sizes, seed):
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    components = {
        "accuracy": rng.integers(0, 2, size=n).astype(np.float32),
        "format": rng.standard_normal(n).astype(np.float32),
        "length": rng.uniform(0, 3, size=n).astype(np.float32),
    }
    components["accuracy"][: sizes[0]] = 1.0  # all-equal in group 0
    scores = sum(components.values())
    return Batch(sizes, scores, seed=seed, components=components)


@pytest.mark.parametrize("weights", [None, [1.0, 0.5, 2.0]])
@pytest.mark.parametrize("norm", [True, False])
def test_gdpo_matches_verls_own_through_the_trainers_dispatch(weights, norm):
    compute_advantage = verl_compute_advantage()
    batch = gdpo_batch(SIZES, seed=3)
    config = OmegaConf.create({"gdpo_reward_keys": list(batch.components), "gdpo_reward_weights": weights})
    reference = core_algos.compute_gdpo_outcome_advantage  # verl's, before it is replaced
    want, _ = reference(
        **batch.kwargs(),
        norm_adv_by_std_in_grpo=norm,
        config=config,
        non_tensor_batch=dict(batch.components),
        batch={"prompts": batch.prompts, "attention_mask": batch.attention_mask},
    )
    # verl hands non_tensor_batch only to the estimator named "gdpo".
    with pytest.raises(ValueError, match="already been registered"):
        attnc.verl.register("gdpo", "gdpo_verl")
    fn = attnc.verl.register("gdpo", "gdpo_verl", replace=True, norm_by_std=norm)
    assert core_algos.get_adv_estimator_fn("gdpo") is fn
    out = compute_advantage(batch.data(), adv_estimator="gdpo", config=config)
    got = batch.per_response(out.batch["advantages"])
    np.testing.assert_allclose(got, batch.per_response(want), rtol=0, atol=TOL)
    assert np.abs(got).max() > 0.5
    # Under another name verl passes no components: refused, not silently the score alone.
    attnc.verl.register("attnc_gdpo", "gdpo_verl")
    with pytest.raises(ValueError, match="register this spec as `gdpo`"):
        compute_advantage(batch.data(), adv_estimator="attnc_gdpo", config=config)


def test_gdpo_without_reward_keys_whitens_the_score_as_verl_does():
    batch = gdpo_batch([3, 5, 2, 4], seed=4)
    want, _ = core_algos.compute_gdpo_outcome_advantage(**batch.kwargs())
    fn = attnc.verl.register("attnc_gdpo", "gdpo_verl")
    got, _ = fn(**batch.kwargs())
    np.testing.assert_allclose(batch.per_response(got), batch.per_response(want), rtol=0, atol=TOL)


def cli_on_groups(tmp, spec, params, uids, scores):
    """The CLI on the batch's groups, one run per group size: [bs] advantages."""
    groups = {}
    for i, u in enumerate(uids):
        groups.setdefault(u, []).append(i)
    out = np.full(len(uids), np.nan)
    sets = [a for k, v in params.items() for a in ("--set", f"{k}={attnc._setting(v)}")]
    for size in sorted({len(m) for m in groups.values()}):
        rows = np.array([m for m in groups.values() if len(m) == size])
        src, dst = tmp / f"in_{size}.safetensors", tmp / f"out_{size}.safetensors"
        save_file({"rewards": np.ascontiguousarray(scores[rows])}, str(src))
        r = subprocess.run([BIN, "run", spec, "--inputs", src, "--dtype", "f64", "--out", dst, *sets], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        out[rows] = load_file(str(dst))["advantages"]
    assert not np.isnan(out).any()
    return out


ODRPO_MAXRL = [
    ("odrpo", {"K": 10}, "ratings"),
    ("odrpo", {"K": 5, "base": "maxrl", "weights": [1.0, 0.5, 2.0, 1.5], "normalize_active": True}, "ratings"),
    ("odrpo", {"K": 4, "base": "mean"}, "ratings"),
    ("maxrl", {}, "binary"),
]


@pytest.mark.parametrize("spec,params,kind", ODRPO_MAXRL)
def test_odrpo_and_maxrl_through_verl_equal_the_cli(tmp_path, spec, params, kind):
    rng = np.random.default_rng(5)
    n = sum(SIZES)
    scores = rng.integers(1, params.get("K", 2) + 1, size=n) if kind == "ratings" else rng.integers(0, 2, size=n)
    batch = Batch(SIZES, scores, seed=6, split=False)
    name = f"attnc_{spec}"
    attnc.verl.register(name, spec, **params)
    out = verl_compute_advantage()(batch.data(), adv_estimator=name, config=None)
    got = batch.per_response(out.batch["advantages"])
    want = cli_on_groups(tmp_path, f"stdlib/{spec}.attn", params, batch.uids, batch.scores)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    assert np.abs(got).max() > 0.5


def test_a_spec_coupling_the_batch_runs_equal_groups_and_refuses_unequal_ones(tmp_path):
    params = {"K": 6, "batch_norm": True}
    fn = attnc.verl.register("attnc_odrpo_bn", "odrpo", **params)
    rng = np.random.default_rng(7)
    equal = Batch([4, 4, 4], rng.integers(1, 7, size=12), seed=8, split=False)
    got = equal.per_response(fn(**equal.kwargs())[0])
    np.testing.assert_allclose(got, cli_on_groups(tmp_path, "stdlib/odrpo.attn", params, equal.uids, equal.scores), rtol=0, atol=TOL)
    unequal = Batch([4, 3, 4], rng.integers(1, 7, size=11), seed=9, split=False)
    with pytest.raises(ValueError, match=r"couples the groups.*unequal sizes \[3, 4\]"):
        fn(**unequal.kwargs())


def test_bad_rewards_raise_attncs_error_naming_group_sample_and_response():
    rng = np.random.default_rng(10)
    for spec, params, bad, message in [
        ("odrpo", {"K": 10}, 11.0, "must be an integer in 1..=10"),
        ("maxrl", {}, 0.5, "must be 0 or 1"),
        ("grpo", {}, float("nan"), "must be a finite number"),
    ]:
        scores = rng.integers(1, 3, size=sum(SIZES)).astype(np.float64) - (spec == "maxrl")
        batch = Batch(SIZES, scores, seed=11, split=False)
        row = 5
        batch.token_level_rewards[row] = 0
        batch.token_level_rewards[row, 0] = bad
        uid = batch.uids[row]
        size = int(np.sum(batch.uids == uid))
        members = [i for i in range(len(batch.uids)) if batch.uids[i] == uid]
        fn = attnc.verl.register(f"attnc_{spec}", spec, **params)
        with pytest.raises(attnc.InputError) as caught:
            fn(**batch.kwargs())
        text = str(caught.value)
        assert message in text and caught.value.code == "E0602" and caught.value.tensor == "rewards", text
        # The launch's group and sample, and verl's response they are.
        group = [u for u in dict.fromkeys(batch.uids) if np.sum(batch.uids == u) == size].index(uid)
        assert f"(group {group}, sample {members.index(row)})" in text, text
        assert f"batch row {row} (uid '{uid}', response {members.index(row)} of its group)" in text, text


def test_groups_of_one_and_all_equal_groups_follow_attncs_rule():
    # attnc gives a group whose rewards are all equal, a group of one included,
    # advantages 0 (docs/semantics.md §3); verl's GRPO gives a group of one mean 0, std 1.
    batch = Batch([3, 1, 4, 2], [0.5, 2.0, -1.0, 7.0, 1.0, 1.0, 1.0, 1.0, 3.0, 4.0], seed=12)
    fn = attnc.verl.register("attnc_grpo", "grpo", std="bessel")
    got = batch.per_response(fn(**batch.kwargs())[0])
    single = batch.uids == "uid-1"
    equal = batch.uids == "uid-2"
    assert np.all(got[single | equal] == 0)
    want = batch.per_response(core_algos.compute_grpo_outcome_advantage(**batch.kwargs())[0])
    np.testing.assert_allclose(got[~single], want[~single], rtol=0, atol=TOL)
    # RLOO has no leave-one-out mean for a group of one: attnc's error.
    rloo = attnc.verl.register("attnc_rloo", "rloo")
    with pytest.raises(attnc.InputError, match=r"group of one sample.*groups of 1 responses \(uids 'uid-1'\)"):
        rloo(**batch.kwargs())


def test_registration_is_refused_as_verl_refuses_it():
    with pytest.raises(ValueError, match="already been registered"):
        attnc.verl.register("rloo", "rloo")
    assert core_algos.get_adv_estimator_fn("rloo") is core_algos.compute_rloo_outcome_advantage
    fn = attnc.verl.register("rloo", "rloo", replace=True)
    assert core_algos.get_adv_estimator_fn("rloo") is fn
    # The same name twice is refused too, unless replaced.
    attnc.verl.register("attnc_x", "dr_grpo")
    with pytest.raises(ValueError, match="already been registered"):
        attnc.verl.register("attnc_x", "dr_grpo")
    # verl's trainer computes GRPO and GAE without its registry.
    for name in ("grpo", "gae"):
        with pytest.raises(ValueError, match="without its estimator registry"):
            attnc.verl.register(name, "grpo", replace=True)
    # Spec parameters are bound once, when registering.
    batch = Batch([2, 2], [1.0, 2.0, 3.0, 5.0])
    with pytest.raises(TypeError, match="parameter of the spec"):
        fn(**batch.kwargs(), norm_adv_by_std_in_grpo=False)
    # A spec a trainer cannot fill.
    with pytest.raises(ValueError, match="must take `rewards`"):
        attnc.verl.register("attnc_mha", "mha")


def test_a_spec_path_and_the_wgpu_backend(tmp_path):
    # A spec from a file, run on the kernels (lavapipe in CI): float32 kernels, 1e-5.
    spec = tmp_path / "mine.attn"
    spec.write_text((ROOT / "stdlib" / "grpo.attn").read_text())
    fn = attnc.verl.register("attnc_mine", str(spec), std="bessel", backend="wgpu")
    batch = Batch(SIZES, normal_scores(SIZES, 13))
    got = batch.per_response(fn(**batch.kwargs())[0])
    want = batch.per_response(core_algos.compute_grpo_outcome_advantage(**batch.kwargs())[0])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_attnc_imports_without_verl_and_trl_and_says_what_to_install():
    code = (
        "import sys\n"
        "for m in ('verl', 'trl'): sys.modules[m] = None\n"
        "import attnc\n"
        "assert attnc.compile('stdlib/grpo.attn').run(rewards=[[1.0, 2.0]])['advantages'].shape == (1, 2)\n"
        "for m, hint in (('attnc.verl', 'pip install verl'), ('attnc.trl', 'pip install trl')):\n"
        "    try:\n"
        "        __import__(m)\n"
        "    except ImportError as e:\n"
        "        assert hint in str(e), str(e)\n"
        "    else:\n"
        "        raise AssertionError(m + ' imported without its library')\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_verl_imports_a_module_of_registrations_in_every_process(tmp_path):
    # How a verl run gets the registrations into its Ray workers: VERL_USE_EXTERNAL_MODULES.
    (tmp_path / "my_estimators.py").write_text('import attnc.verl\nattnc.verl.register("attnc_odrpo", "odrpo", K=10)\n')
    code = (
        "from verl.trainer.ppo import core_algos\n"
        "fn = core_algos.get_adv_estimator_fn('attnc_odrpo')\n"
        "print(type(fn).__module__, fn.program.inputs[0].domain)\n"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="my_estimators")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["attnc.verl", "Integers", "{", "lo:", "1,", "hi:", "10", "}"], r.stdout
