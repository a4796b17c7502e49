"""The conv-bias fold through the user's path on the CPU: `run --dry-run` of the SD3.5 VAE (small) with folds and
twins on captures, for every GroupNorm -> SiLU after a biased convolution it feeds alone, the chain with that
bias add in front and its channels-last twin; the twins get chain_bias_group_norm_silu kernels that compile for
the H200, and the contiguous originals are declined (the group_norm_cl kernels read channels-last only)."""

import json

import pytest


@pytest.mark.xdist_group("sd35_vae_dry_run")
def test_a_dry_run_of_the_vae_proposes_and_compiles_every_fold_twin(sd35_vae_dry_run):
    # the run (conftest.sd35_vae_dry_run): [capture] layout_twins and conv_bias_folds on, --ops group_norm,
    # --iterations 1; test_chain_twins reads its other cards
    code, out, err = sd35_vae_dry_run
    assert code == 0, err
    folds = [c for c in json.loads(out)["cards"] if c.get("folded_from")]
    assert all(c["signature"].startswith("chain[add native_group_norm silu]") for c in folds), folds
    twins = [c for c in folds if c["twin_of"]]
    originals = [c for c in folds if not c["twin_of"]]
    assert len(twins) >= 3 and len(originals) == len(twins), [c["signature"] for c in folds]
    assert all(c["stopped"] == "declined" for c in originals)
    failed = [(c["signature"], c["failures"]) for c in twins if c["compiled"] < 1 or c["failures"]]
    assert not failed, failed
